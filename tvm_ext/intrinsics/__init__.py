"""Tensor intrinsics: ours (``vnni``) and a fast import of TVM's (``fast_import``)."""
