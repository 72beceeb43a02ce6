"""Shared device code (.cuh headers) of the exact and fast kernels: every kernel build has this folder on its include
path (kernels_cu.loader). A package only so that the headers ship as its package data."""
