"""Gradient sets of the models benchmarks/scaling_model.py predicts, written
from their architectures (not from typed sizes): every trainable tensor with
its element count and the multiply-accumulates of the layer that owns it
(per sample), in forward order.

- ResNet-50 (He et al. 2016, "Deep Residual Learning", Table 1; the
  torchvision layout: bottleneck stride on the 3x3 convolution, convolutions
  without bias, a batch norm (gamma, beta) after each, a 1x1 projection on
  the first block of each stage, a 1000-way fully connected layer):
  25,557,032 parameters in 161 tensors, about 4.1 GMAC per 224x224 image.
- BERT-large (Devlin et al. 2019, "BERT", Section 3: L=24, H=1024, A=16,
  feed-forward 4H, vocabulary 30,522 WordPiece tokens, 512 positions, 2
  segment types), the encoder and pooler: 335,141,888 parameters in 391
  tensors; per token, a matrix's MACs equal its element count (embedding
  lookups: none), plus attention's 2 * seq * H per layer.
"""

from collections import namedtuple

Tensor = namedtuple("Tensor", "name elems macs")  # macs: per sample, forward


def resnet50(image=224, classes=1000):
    tensors = []

    def conv(name, cin, cout, k, hw_out):
        tensors.append(Tensor(f"{name}.weight", cin * cout * k * k,
                              cin * cout * k * k * hw_out * hw_out))
        tensors.append(Tensor(f"{name}.bn.gamma", cout, 0))
        tensors.append(Tensor(f"{name}.bn.beta", cout, 0))

    hw = image // 2  # 7x7 stride-2 stem
    conv("conv1", 3, 64, 7, hw)
    hw //= 2  # 3x3 stride-2 max pool
    cin = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for b in range(blocks):
            stride = 2 if (b == 0 and stage > 0) else 1
            out_hw = hw // stride
            name = f"layer{stage + 1}.{b}"
            conv(f"{name}.conv1", cin, width, 1, hw)
            conv(f"{name}.conv2", width, width, 3, out_hw)
            conv(f"{name}.conv3", width, 4 * width, 1, out_hw)
            if b == 0:
                conv(f"{name}.downsample", cin, 4 * width, 1, out_hw)
            cin, hw = 4 * width, out_hw
    tensors.append(Tensor("fc.weight", cin * classes, cin * classes))
    tensors.append(Tensor("fc.bias", classes, 0))
    return tensors


def bert_large(seq=128, layers=24, hidden=1024, ffn=4096, vocab=30522, positions=512,
               segments=2):
    """Per sample = one sequence of ``seq`` tokens."""
    h = hidden
    tensors = [
        Tensor("embeddings.word", vocab * h, 0),
        Tensor("embeddings.position", positions * h, 0),
        Tensor("embeddings.segment", segments * h, 0),
        Tensor("embeddings.ln.gamma", h, 0),
        Tensor("embeddings.ln.beta", h, 0),
    ]

    def dense(name, n_in, n_out, extra_macs=0):
        tensors.append(Tensor(f"{name}.weight", n_in * n_out, n_in * n_out * seq + extra_macs))
        tensors.append(Tensor(f"{name}.bias", n_out, 0))

    for i in range(layers):
        p = f"layer{i}"
        dense(f"{p}.attention.query", h, h)
        dense(f"{p}.attention.key", h, h)
        # scores (Q K^T) and the weighted sum of values: 2 * seq^2 * h MACs
        dense(f"{p}.attention.value", h, h, extra_macs=2 * seq * seq * h)
        dense(f"{p}.attention.output", h, h)
        tensors.append(Tensor(f"{p}.attention.ln.gamma", h, 0))
        tensors.append(Tensor(f"{p}.attention.ln.beta", h, 0))
        dense(f"{p}.intermediate", h, ffn)
        dense(f"{p}.output", ffn, h)
        tensors.append(Tensor(f"{p}.output.ln.gamma", h, 0))
        tensors.append(Tensor(f"{p}.output.ln.beta", h, 0))
    tensors.append(Tensor("pooler.weight", h * h, h))  # first token only
    tensors.append(Tensor("pooler.bias", h, 0))
    return tensors


MODELS = {"resnet50": resnet50, "bert-large": bert_large}
