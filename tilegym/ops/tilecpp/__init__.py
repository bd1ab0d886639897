"""Backend `tilecpp`: registers its ops (no kernels yet)."""
