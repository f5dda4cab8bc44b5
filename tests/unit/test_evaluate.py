"""`tformer eval`'s pieces (evaluate.py) that compute on tensors."""

import torch

from tformer_cli.evaluate import confusion_matrix


def test_confusion_matrix_counts_true_by_predicted_on_the_labels_device(device):
    labels = torch.tensor([0, 0, 1, 2, 2, 2], device=device)
    predicted = torch.tensor([0, 1, 1, 2, 0, 2], device=device)
    assert confusion_matrix(predicted, labels, 3) == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]
