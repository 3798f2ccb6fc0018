"""`python -m kgen ...` is the `kgen` command."""
from .cli import main

if __name__ == "__main__":  # kgen tune's spawned compile workers import this module again
    main()
