"""Exact epoch metrics from sums and counts: a loss returns `metric(scores, labels, mask=...)` (a
`Stat`) beside its batch means, and `fit`, validation and `jaxtrain.evaluate` add the counts up over
every row before computing F1, precision, recall, top-k or a mean (see `jaxtrain._src.metrics`)."""

from jaxtrain._src.metrics import F1, Accuracy, Mean, Metric, Precision, Recall, Stat, TopK

__all__ = ["F1", "Accuracy", "Mean", "Metric", "Precision", "Recall", "Stat", "TopK"]
