"""The HTTP API against the real aiohttp app in process: every resource, the wire structs, CORS."""
