"""Classification scores: accuracy and macro-F1.

classification_metrics(gold=[0, 1, 1], predicted=[0, 1, 0], num_classes=2)
# {"accuracy": 0.667, "macro_f1": 0.667}
"""

import numpy as np


def classification_metrics(gold, predicted, num_classes):
    """Accuracy and macro-F1 (the mean of per-class F1 over classes present in gold or predictions)."""
    gold, predicted = np.asarray(gold), np.asarray(predicted)
    f1s = []
    for c in range(num_classes):
        true_positive = np.sum((predicted == c) & (gold == c))
        predicted_c, gold_c = np.sum(predicted == c), np.sum(gold == c)
        if predicted_c == 0 and gold_c == 0:
            continue
        f1s.append(2 * true_positive / (predicted_c + gold_c))
    return {"accuracy": float(np.mean(gold == predicted)), "macro_f1": float(np.mean(f1s)) if f1s else 0.0}
