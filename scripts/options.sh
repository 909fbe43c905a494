# Argument parsing shared by the scripts in this folder (sourced, not run).
# parse_options "VALUE_OPTIONS" "FLAG_OPTIONS" ARG...: `--name VALUE` (name in VALUE_OPTIONS)
# sets the variable name (dashes as underscores) to VALUE, `--name` (name in FLAG_OPTIONS) sets
# it to 1; the other arguments land, in order, in the array `positional`. Anything else starting
# with -- is an error (exit 2).
parse_options() {
  local values=" $1 " flags=" $2 " name
  shift 2
  positional=()
  while (($#)); do
    name=${1#--}
    if [[ $1 != --* ]]; then
      positional+=("$1")
    elif [[ $values == *" $name "* && $# -ge 2 ]]; then
      printf -v "${name//-/_}" '%s' "$2"
      shift
    elif [[ $flags == *" $name "* ]]; then
      printf -v "${name//-/_}" 1
    else
      echo "unknown argument $1" >&2
      exit 2
    fi
    shift
  done
}
