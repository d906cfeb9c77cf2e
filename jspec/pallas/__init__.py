"""Pallas GPU kernels; each module = kernel + wrapper + pure-jnp reference."""
