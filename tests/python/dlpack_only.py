"""An array fp8mla knows only through DLPack and its dtype, as it knows cupy's and other
frameworks' arrays: the path neither numpy nor torch takes."""


class DLPackOnly:
    def __init__(self, a):
        self.a, self.dtype, self.shape = a, a.dtype, a.shape

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()
