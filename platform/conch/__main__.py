import sys

from conch.cli import main

if __name__ == "__main__":  # not when a spawned process instance imports it
    sys.exit(main())
