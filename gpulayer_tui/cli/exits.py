"""The CLI's exit codes (one place, for every subcommand and the docs).

0 success; 1 the job did not complete / the engine refused; 2 bad usage or invalid input;
3 no engine is running.
"""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_ENGINE = 0, 1, 2, 3
