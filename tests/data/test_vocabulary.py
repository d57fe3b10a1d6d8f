from amptrain.data.vocabulary import RESERVED_TOKENS, WordPiece, pad_to_multiple, train_vocabulary


def test_pad_to_multiple_of_8():
    assert len(pad_to_multiple(["a"] * 13, 8)) == 16
    assert pad_to_multiple(["a"] * 13, 8)[13:] == ["[unused0]", "[unused1]", "[unused2]"]
    assert len(pad_to_multiple(["a"] * 16, 8)) == 16


def test_trained_vocabulary_is_sorted_after_the_reserved_tokens_and_tokenizes():
    texts = ["the cat sat on the mat", "the dog sat on the log", "cats and dogs"] * 5
    vocabulary = train_vocabulary(texts, size=60)
    assert vocabulary[:5] == RESERVED_TOKENS
    learned = [t for t in vocabulary[5:] if not t.startswith("[unused")]
    assert learned == sorted(learned)
    assert len(vocabulary) % 8 == 0
    tokenizer = WordPiece(vocabulary)
    ids = tokenizer.encode(["The cat sat", "zzz"])
    assert [vocabulary[i] for i in ids[0]] == ["the", "cat", "sat"]  # lowercased
    assert all(vocabulary[i] == "[UNK]" or vocabulary[i].strip("#") for i in ids[1])
