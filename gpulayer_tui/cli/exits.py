"""The CLI's exit codes (one place, for every subcommand and the docs).

0 success; 1 the job did not complete / the engine refused; 2 bad usage or invalid input
(nothing changed); 3 no engine is running; 4 the engine took the request but stopped
answering (stopped, killed, overloaded): whether it acted is unknown; 5 the job had not
ended when the command's ``--timeout`` ran out (``wait``, ``cancel``): it may still
complete, so a script must not read that as a failure.
"""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_ENGINE, EXIT_LOST, EXIT_TIMED_OUT = 0, 1, 2, 3, 4, 5
