"""Hugging Face Trainer's side of benchmarks/peer_speed.py: run with the
peer venv's Python (PyTorch and transformers, requirements-peer.txt),
never the project's. Fine-tunes the Hugging Face folder of
all-MiniLM-L6-v2 on the train examples peer_speed.py wrote (JSON lines of
text and label), with the main job's recipe: micro-batch 8 x 4 accumulated
steps (or another split of the batch 32: --micro_batch, --accumulation),
AdamW 5e-5, 10% warmup then linear decay, weight decay 0.01, clip 1.0,
max length 128, padding per batch; evaluates on the dev examples.
Prints one line, `RESULT {json}`: training seconds (Trainer's train()),
examples, accuracy.

  .venv-peer/bin/python benchmarks/peer_hf_trainer.py --model DIR \\
      --data DIR [--group_by_length] [--epochs 1] [--seed 42]
      [--micro_batch 8 --accumulation 4] [--bf16]
"""

import argparse
import json
import os
import sys
import tempfile
import time


def _read(path):
  with open(path) as file:
    return [json.loads(line) for line in file]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", required=True)
  parser.add_argument("--data", required=True)
  parser.add_argument("--epochs", type=float, default=1.0)
  parser.add_argument("--seed", type=int, default=42)
  parser.add_argument("--group_by_length", action="store_true")
  parser.add_argument("--micro_batch", type=int, default=8)
  parser.add_argument("--accumulation", type=int, default=4)
  parser.add_argument("--bf16", action="store_true",
                      help="TrainingArguments(bf16=True): autocast to "
                           "bfloat16 on the CPU")
  args = parser.parse_args()

  import numpy as np  # noqa: PLC0415
  import torch  # noqa: PLC0415
  import transformers  # noqa: PLC0415

  transformers.logging.set_verbosity_error()
  tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)

  class Examples(torch.utils.data.Dataset):
    def __init__(self, rows):
      encoded = tokenizer([row["text"] for row in rows], truncation=True,
                          max_length=128)
      self.items = [{"input_ids": ids, "attention_mask": mask,
                     "labels": row["label"]}
                    for ids, mask, row in zip(encoded["input_ids"],
                                              encoded["attention_mask"], rows)]

    def __len__(self):
      return len(self.items)

    def __getitem__(self, index):
      return self.items[index]

  train = Examples(_read(os.path.join(args.data, "train.jsonl")))
  dev = Examples(_read(os.path.join(args.data, "dev.jsonl")))
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      args.model, num_labels=2)
  with tempfile.TemporaryDirectory() as output_dir:
    trainer = transformers.Trainer(
        model=model,
        args=transformers.TrainingArguments(
            output_dir=output_dir,
            per_device_train_batch_size=args.micro_batch,
            gradient_accumulation_steps=args.accumulation, learning_rate=5e-5,
            warmup_ratio=0.1, lr_scheduler_type="linear", weight_decay=0.01,
            max_grad_norm=1.0, num_train_epochs=args.epochs, seed=args.seed,
            group_by_length=args.group_by_length,
            per_device_eval_batch_size=64, save_strategy="no",
            report_to=[], logging_strategy="no", disable_tqdm=True,
            use_cpu=True, bf16=args.bf16),
        train_dataset=train,
        data_collator=transformers.DataCollatorWithPadding(tokenizer))
    started = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - started
    predictions = trainer.predict(dev)
  accuracy = float(np.mean(np.argmax(predictions.predictions, axis=-1) ==
                           predictions.label_ids))
  print("RESULT " + json.dumps({
      "train_seconds": train_seconds,
      "examples": int(round(len(train) * args.epochs)),
      "accuracy": accuracy, "torch": torch.__version__,
      "transformers": transformers.__version__,
      "threads": torch.get_num_threads()}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
