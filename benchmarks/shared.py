"""What the benchmarks share: the model they time. Import it after the repository root is on sys.path."""
from model import GPT, GPTConfig

# the shape of the default char model (config/train_shakespeare_char.py)
DEFAULT_SHAPE = dict(block_size=256, vocab_size=84, n_layer=4, n_head=4, n_embd=128)


def bench_model(model_path, mode='generator'):
    """The checkpoint at model_path in the given mode, or a fresh model of the default char model's shape."""
    if model_path:
        return GPT.from_checkpoint(model_path, mode=mode)
    return GPT(GPTConfig(**DEFAULT_SHAPE, mode=mode)).eval()
