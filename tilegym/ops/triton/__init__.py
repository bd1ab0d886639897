"""Backend `triton`: registers its ops (no kernels yet)."""
