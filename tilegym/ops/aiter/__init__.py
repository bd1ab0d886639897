"""Backend `aiter`: registers its ops (no kernels yet)."""
