import os
import pickle

import pytest

from tokenization_manager import TokenizationInfo, TokenizationManager


def test_bpe_offline_gpt2():
    tok = TokenizationManager('bpe')
    assert tok.encode("hello world") == [31373, 995]
    assert tok.vocab_size == 50257
    assert tok.decode(tok.encode("To be, or not to be")) == "To be, or not to be"
    assert tok.info() == {'method': 'bpe', 'vocab_size': 50257, 'meta_path': None}


def write_meta(path, chars='abc \n'):
    meta = {'vocab_size': len(chars), 'itos': dict(enumerate(chars)), 'stoi': {c: i for i, c in enumerate(chars)}}
    with open(path, 'wb') as f:
        pickle.dump(meta, f)
    return str(path)


def test_char_round_trip_and_unknown_character(tmp_path):
    tok = TokenizationManager('char', meta_path=write_meta(tmp_path / 'meta.pkl'))
    assert tok.encode("cab a") == [2, 0, 1, 3, 0]
    assert tok.decode([2, 0, 1]) == "cab"
    assert tok.vocab_size == 5 and tok.info()['method'] == 'char'
    with pytest.raises(ValueError, match=r"'z' at position 2"):
        tok.encode("abz!")
    from data_loader import tokens_a_word
    assert tokens_a_word(tok.encode("cab a"), tok) == 5 / 2  # characters a word, spaces included: nats a word's factor


def test_a_char_vocabulary_travels_in_its_record(tmp_path):
    tok = TokenizationManager('char', meta_path=write_meta(tmp_path / 'meta.pkl'))
    os.remove(tmp_path / 'meta.pkl')  # the record's own characters, not the file, decode
    moved = TokenizationManager.from_info(tok.info())
    assert moved.decode(tok.encode("cab a")) == "cab a" and moved.vocab_size == 5
    same_size = TokenizationManager('char', meta_path=write_meta(tmp_path / 'other.pkl', chars='xyz \n'))
    mine, other = TokenizationInfo.from_dict(tok.info()), TokenizationInfo.from_dict(same_size.info())
    assert other.differences(mine) == ['characters: the same vocabulary size, other characters']
    assert other.differences(TokenizationInfo('char', 5)) == []  # a record without characters (reward data's)


def test_auto_detection(tmp_path):
    meta = write_meta(tmp_path / 'meta.pkl')
    assert TokenizationManager('auto', meta_path=meta).method == 'char'
    assert TokenizationManager('auto', data_dir=str(tmp_path)).method == 'char'
    plain = tmp_path / 'words'
    plain.mkdir()
    assert TokenizationManager('auto', data_dir=str(plain)).method == 'bpe'
    charless = tmp_path / 'my_char_set'
    charless.mkdir()
    with pytest.raises(FileNotFoundError, match="no meta.pkl"):
        TokenizationManager('auto', data_dir=str(charless))


class Exploit:
    def __reduce__(self):
        return (os.system, ('touch PWNED_BY_META',))


def test_malicious_meta_is_rejected_without_running(tmp_path):
    path = tmp_path / 'meta.pkl'
    with open(path, 'wb') as f:
        pickle.dump({'vocab_size': 1, 'stoi': {'a': 0}, 'itos': {0: 'a'}, 'x': Exploit()}, f)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(ValueError, match="plain-data"):
            TokenizationManager('char', meta_path=str(path))
    finally:
        os.chdir(cwd)
    assert not (tmp_path / 'PWNED_BY_META').exists()


def test_meta_with_wrong_structure_is_rejected(tmp_path):
    path = tmp_path / 'meta.pkl'
    with open(path, 'wb') as f:
        pickle.dump({'vocab_size': 1, 'stoi': {'a': 'zero'}, 'itos': {0: 'a'}}, f)
    with pytest.raises(ValueError, match="not a nanoGPT meta.pkl"):
        TokenizationManager('char', meta_path=str(path))
