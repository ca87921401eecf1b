"""Lesson 00 (DDP in ten minutes): a plain training script, one process.

    python ddp_scripts/00_ddp_in_ten_minutes/train_plain.py
"""

import torch
import torch.nn.functional as F
from ddp_common import write_results
from digits_cnn import Meter, load_data, make_model, parse_args, test_accuracy
from torch.utils.data import DataLoader, RandomSampler


def main():
    args = parse_args(__doc__)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_set, test = load_data()
    torch.manual_seed(0)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    sampler = RandomSampler(train_set, generator=torch.Generator())
    loader = DataLoader(train_set, batch_size=args.batch, sampler=sampler)
    meter = Meter()  # samples trained on, per second
    for epoch in range(args.epochs):
        sampler.generator.manual_seed(epoch)  # a new order every epoch, reproducible
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            meter.count(len(y))
        accuracy = test_accuracy(model, test, device)
        print(f"epoch {epoch}: loss {loss.item():.3f}, test accuracy {accuracy:.3f}")
    found = meter.results()
    print(f"trained on {found['samples']} samples, {found['per_second']:.0f} per second")
    write_results(args.out, model, accuracy=accuracy, **found)


if __name__ == "__main__":
    main()
