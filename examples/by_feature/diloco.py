"""Replica groups that talk rarely: DiLoCo and streaming DiLoCo behind Accelerate's ``LocalSGD``.

Each replica group trains on its own for ``--sync_every`` optimizer steps (DDP or FSDP2 inside
the group, as usual); then the groups average how far their weights moved (the
*pseudo-gradient*) and an outer optimizer (SGD with Nesterov momentum) applies it. Across groups
only that outer sync travels: ``--sync_every`` times fewer exchanges than per-step replica
groups or DDP across machines. Streaming DiLoCo (``--fragments F``) syncs one fragment of the
model at a time, spreading the traffic, and ``--fragment_sync_delay D`` lets the exchange run
during the next D steps. Run it as 2 replica groups (needs ``pip install 'accel[ft]'``):

    accel launch --cpu --ft_replicas 2 --num_processes 1 --max_restarts 3 \
        examples/by_feature/diloco.py --sync_every 20

On two machines, one group each (a lighthouse on the first: ``torchft_lighthouse
--min_replicas 1 --bind [::]:29510``):

    accel launch --ft_lighthouse HOST:29510 --ft_replica_id I examples/by_feature/diloco.py

The model is a small language model learning text drawn from a random Markov chain, so its best
possible evaluation loss is known (the chain's entropy, printed at the start). Kill a worker
(``kill -9``) mid-training: the other group goes on, the killed one is relaunched and heals
from it, and the samples of the round that did not sync are handed out again, so every sample
is trained in exactly one committed outer step (``--no_diloco`` runs per-step replica groups on
the same model and data, for comparison).
"""

from __future__ import annotations

import argparse
import math

import torch
from torch.utils.data import DataLoader, Dataset

from accel import Accelerator, DiLoCoSettings
from accel.local_sgd import LocalSGD
from accel.utils import set_seed

VOCABULARY = 48
CONTEXT = 32


class MarkovText(Dataset[torch.Tensor]):
    """Token sequences drawn from one fixed random Markov chain (the same for every seed)."""

    def __init__(self, count: int, seed: int) -> None:
        chain = torch.Generator().manual_seed(1234)
        logits = 3.0 * torch.randn(VOCABULARY, VOCABULARY, generator=chain)
        self.transitions = torch.softmax(logits, dim=1)
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.empty(count, CONTEXT + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(VOCABULARY, (count,), generator=generator)
        for position in range(1, CONTEXT + 1):
            rows = self.transitions[tokens[:, position - 1]]
            tokens[:, position] = torch.multinomial(rows, 1, generator=generator).squeeze(1)
        self.tokens = tokens

    def entropy(self) -> float:
        """The chain's average next-token entropy (nats): the best loss any model can reach."""
        stationary = torch.full((VOCABULARY,), 1.0 / VOCABULARY)
        for _ in range(200):
            stationary = stationary @ self.transitions
        per_state = -(self.transitions * self.transitions.clamp_min(1e-12).log()).sum(dim=1)
        return float((stationary * per_state).sum())

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.tokens[index]


class TinyLanguageModel(torch.nn.Module):
    """One causal transformer layer over token and position embeddings."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCABULARY, width)
        self.position = torch.nn.Embedding(CONTEXT, width)
        self.layer = torch.nn.TransformerEncoderLayer(
            width, nhead=4, dim_feedforward=4 * width, dropout=0.0, batch_first=True
        )
        self.head = torch.nn.Linear(width, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits for every position of ``tokens`` (batch, length)."""
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        hidden = self.embed(tokens) + self.position(positions)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        return self.head(self.layer(hidden, src_mask=mask, is_causal=True))


def next_token_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting each token from the ones before it."""
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCABULARY), tokens[:, 1:].flatten()
    )


def evaluate(accelerator: Accelerator, model: torch.nn.Module, loader: DataLoader) -> float:
    """Evaluation loss over the whole held-out set (gathered inside the group)."""
    model.eval()
    losses = []
    with torch.no_grad():
        for tokens in loader:
            losses.append(next_token_loss(model, tokens).reshape(1))
    model.train()
    return accelerator.gather_for_metrics(torch.cat(losses)).mean().item()


def main() -> None:
    """Train for ``--epochs``, evaluating after each; print the final evaluation loss."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--sync_every", type=int, default=20)
    parser.add_argument("--fragments", type=int, default=1)
    parser.add_argument("--fragment_sync_delay", type=int, default=0)
    parser.add_argument("--quantize", action="store_true", help="int8 exchange (CUDA only)")
    parser.add_argument("--no_diloco", action="store_true", help="per-step replica groups")
    args = parser.parse_args()

    set_seed(0)
    accelerator = Accelerator()
    train_set, eval_set = MarkovText(args.samples, seed=1), MarkovText(256, seed=2)
    accelerator.print(f"best possible loss (the chain's entropy): {train_set.entropy():.4f}")
    model = TinyLanguageModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    evaluation = DataLoader(eval_set, batch_size=64)
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)

    diloco = DiLoCoSettings(
        fragments=args.fragments,
        fragment_sync_delay=args.fragment_sync_delay,
        quantize=args.quantize,
    )
    with LocalSGD(
        accelerator,
        model,
        local_sgd_steps=args.sync_every,
        enabled=not args.no_diloco,
        diloco=None if args.no_diloco else diloco,
    ) as local_sgd:
        for epoch in range(args.epochs):
            for tokens in train:
                loss = next_token_loss(model, tokens)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                local_sgd.step()
            accelerator.print(
                f"epoch {epoch}: eval loss {evaluate(accelerator, model, evaluation):.4f} "
                "(this group's weights; the groups agree after each outer sync)"
            )
    final = evaluate(accelerator, model, evaluation)
    accelerator.print(f"final eval loss {final:.4f} (perplexity {math.exp(final):.2f})")
    accelerator.end_training()


if __name__ == "__main__":
    main()
