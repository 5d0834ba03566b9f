"""The engine: domains, jobs, GPU observation and state. A library with no UI imports."""
