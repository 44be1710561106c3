"""Examples of aeroqueue in use: a web handler (`webapp`) and a worker handler (`handlers`)."""
