"""`python -m tformer_cli` runs the CLI (also what `torchrun -m tformer_cli` uses)."""

from tformer_cli.cli import main

if __name__ == "__main__":
    main()
