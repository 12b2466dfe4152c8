"""Kernels written as a user of tkc would write them (not shipped with tkc), checked by tests/test_user_kernels.py."""
