"""The code tool: sandboxed Python execution pool, renderer, HTTP service and Ray scale-out."""
