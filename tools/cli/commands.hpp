// Subcommands of the fp8mla tool; each registers itself on the app and runs from its callback.
#pragma once

#include <CLI/CLI.hpp>

namespace fp8mla::cli {

void add_info_command(CLI::App& app);

}  // namespace fp8mla::cli
