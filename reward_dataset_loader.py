"""
The reward dataset written by prepare_reward_data.py: {split}_x.bin (uint16, (n, N)), {split}_y.bin (float32, (n, 2))
and {split}_metadata.txt, memory-mapped so a dataset larger than RAM opens instantly.

  python reward_dataset_loader.py [data_dir]     # report on a dataset and test its DataLoader
"""

import os

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from tokenization_manager import TokenizationInfo

CREATE_HINT = "create it with prepare_reward_data.py --model_path ... --output_dir {}"


def read_metadata(path):
    with open(path) as f:
        return dict(line.rstrip('\n').split(': ', 1) for line in f if ': ' in line)


class RewardDataset(Dataset):

    def __init__(self, data_dir, split='train', expected_tokenization_info=None):
        self.data_dir, self.split = data_dir, split
        paths = {kind: os.path.join(data_dir, f'{split}_{kind}') for kind in ('x.bin', 'y.bin', 'metadata.txt')}
        for path in paths.values():
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path} not found: {CREATE_HINT.format(data_dir)}")
        self.metadata = read_metadata(paths['metadata.txt'])
        try:
            self.num_samples = int(self.metadata['num_samples'])
            self.block_size = int(self.metadata['block_size'])
            self.tokenization = TokenizationInfo(self.metadata['tokenization_method'],
                                                 int(self.metadata['vocab_size']),
                                                 None if self.metadata.get('meta_path') in (None, 'None')
                                                 else self.metadata['meta_path'])
        except KeyError as e:
            raise ValueError(f"{paths['metadata.txt']} lacks {e}: {CREATE_HINT.format(data_dir)}") from None
        expected = {'x.bin': self.num_samples * self.block_size * 2, 'y.bin': self.num_samples * 2 * 4}
        for kind, size in expected.items():
            actual = os.path.getsize(paths[kind])
            if actual != size:
                raise ValueError(f"{paths[kind]} is {actual} bytes, but its metadata ({self.num_samples} samples of "
                                 f"block size {self.block_size}) implies {size}: the files do not belong together; "
                                 f"{CREATE_HINT.format(data_dir)}")
        if expected_tokenization_info is not None:
            expected_info = expected_tokenization_info
            if isinstance(expected_info, dict):
                expected_info = TokenizationInfo.from_dict(expected_info)
            expected_info.check_compatible(self.tokenization, 'the model', f'the reward dataset {data_dir}')
        self.x = np.memmap(paths['x.bin'], dtype=np.uint16, mode='r', shape=(self.num_samples, self.block_size))
        self.y = np.memmap(paths['y.bin'], dtype=np.float32, mode='r', shape=(self.num_samples, 2))
        self.samples_per_chunk = int(self.metadata.get('samples_per_chunk', 1))
        natural = os.path.join(data_dir, f'{split}_natural.bin')  # format 3: each sample's natural block
        self.natural = np.memmap(natural, dtype=np.uint16, mode='r').reshape(-1, self.block_size) \
            if os.path.exists(natural) else None
        blocks = -(-self.num_samples // self.samples_per_chunk)
        if self.natural is not None and len(self.natural) != blocks:
            raise ValueError(f"{natural} holds {len(self.natural)} blocks, but {self.num_samples} samples of "
                             f"{self.samples_per_chunk} per block need {blocks}: {CREATE_HINT.format(data_dir)}")

    def __len__(self):
        return self.num_samples

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i].astype(np.int64)), torch.from_numpy(np.array(self.y[i]))

    def natural_of(self, rows):
        """The natural block each of these samples was cut from: its prefix with the corpus' own continuation, the
        other half of a pairwise judge's pair."""
        if self.natural is None:
            raise ValueError(f"{self.data_dir} has no {self.split}_natural.bin (reward data of format 3 and later "
                             f"keep each sample's natural block): {CREATE_HINT.format(self.data_dir)}")
        return self.natural[np.asarray(rows) // self.samples_per_chunk]

    def selection_and_test_rows(self):
        """
        The val split cut in two for honest figures: rows of even blocks select (early stopping, the best checkpoint),
        rows of odd blocks report. All samples of one natural block share its prefix, so they stay on one side.
        """
        block = np.arange(self.num_samples) // self.samples_per_chunk
        select, test = np.flatnonzero(block % 2 == 0), np.flatnonzero(block % 2 == 1)
        if len(test) == 0:
            raise ValueError(f"{self.data_dir} has {self.num_samples} val samples from one block: selection and test "
                             f"need at least two val blocks (raise --max_blocks)")
        return select, test

    def get_tokenization_info(self):
        return self.tokenization

    def get_stats(self):
        y = np.asarray(self.y, dtype=np.float64)
        sums = y.sum(axis=1)
        return dict(num_samples=self.num_samples, block_size=self.block_size, y_min=float(y.min()),
                    y_max=float(y.max()), y_mean=float(y[:, 0].mean()), y_std=float(y[:, 0].std()),
                    prob_sum_min=float(sums.min()), prob_sum_max=float(sums.max()), prob_sum_mean=float(sums.mean()),
                    tokenization_method=self.tokenization.method, vocab_size=self.tokenization.vocab_size)


def create_reward_dataloaders(data_dir, batch_size=32, num_workers=0, expected_tokenization_info=None, seed=0):
    """(train_loader, val_loader): train shuffled (seeded), val in order; pinned memory when CUDA is present."""
    train = RewardDataset(data_dir, 'train', expected_tokenization_info)
    val = RewardDataset(data_dir, 'val', expected_tokenization_info)
    pin = torch.cuda.is_available()
    gen = torch.Generator().manual_seed(seed)
    return (DataLoader(train, batch_size=batch_size, shuffle=True, num_workers=num_workers, pin_memory=pin,
                       generator=gen),
            DataLoader(val, batch_size=batch_size, shuffle=False, num_workers=num_workers, pin_memory=pin))


def print_dataset_info(data_dir):
    print(f"Reward dataset: {data_dir}")
    infos = {}
    for split in ('train', 'val'):
        ds = RewardDataset(data_dir, split)
        s = ds.get_stats()
        infos[split] = ds.get_tokenization_info()
        print(f"\n{split.upper()} split:")
        print(f"  samples: {s['num_samples']:,}")
        print(f"  block size: {s['block_size']}")
        print(f"  tokenization: {s['tokenization_method']} (vocab size {s['vocab_size']})")
        print(f"  Y range: [{s['y_min']:.4f}, {s['y_max']:.4f}]")
        print(f"  P(natural) mean: {s['y_mean']:.4f}, std: {s['y_std']:.4f}")
        print(f"  probability sums: min {s['prob_sum_min']:.6f}, max {s['prob_sum_max']:.6f}, "
              f"mean {s['prob_sum_mean']:.6f}")
    diff = infos['train'].differences(infos['val'])
    print(f"\ntokenization consistency: {'train and val match' if not diff else 'MISMATCH: ' + '; '.join(diff)}")
    train_loader, _ = create_reward_dataloaders(data_dir, batch_size=4)
    x, y = next(iter(train_loader))
    print(f"DataLoader test: batch x {tuple(x.shape)} {x.dtype}, y {tuple(y.shape)} {y.dtype}: OK")


if __name__ == '__main__':
    from configurator import run_cli
    run_cli(lambda argv: print_dataset_info(argv[0] if argv else 'data/reward_dataset'))
