"""The CLI's exit codes (one place, for every subcommand and the docs).

0 success; 1 the job did not complete / the engine refused; 2 bad usage or invalid input
(nothing changed); 3 no engine is running; 4 the engine took the request but stopped
answering (stopped, killed, overloaded): whether it acted is unknown.
"""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_ENGINE, EXIT_LOST = 0, 1, 2, 3, 4
