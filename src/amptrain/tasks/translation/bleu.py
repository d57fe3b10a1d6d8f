"""Translation scores: sacrebleu's corpus BLEU and chrF.

corpus_scores(["the cat sat"], ["the cat sat down"])   # {"bleu": ..., "chrf": ...}
"""


def corpus_scores(hypotheses, references):
    """sacrebleu's corpus BLEU (13a tokenisation) and chrF, on its 0-100 scale."""
    import sacrebleu

    return {
        "bleu": float(sacrebleu.corpus_bleu(hypotheses, [references]).score),
        "chrf": float(sacrebleu.corpus_chrf(hypotheses, [references]).score),
    }
