"""SARA in your own loop: plain transformers sampling, a TRL-style reward, no railgate orchestrator.

    python examples/sara_in_your_loop.py MODEL_DIR     # any Hugging Face causal-LM directory

You choose the prompts and sample; SARA says after each batch of rewards whether to sample more
of the group, train on it (it will be mixed: a non-zero GRPO advantage) or drop it (all right or
all wrong: nothing to learn, and the rest of the group is never paid for).
"""

import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from controller.driver import GateDriver, LifecycleError


def accuracy(prompts, completions, answer, **columns):  # TRL's reward-function signature
    return [float(c.strip().startswith(str(a))) for c, a in zip(completions, answer)]


def sample(model, tok, text, n):  # plain transformers sampling, n completions of one prompt
    batch = {k: v.repeat(n, 1) for k, v in tok(text, return_tensors="pt").items()}
    out = model.generate(**batch, do_sample=True, max_new_tokens=6, pad_token_id=tok.pad_token_id or tok.eos_token_id)
    return tok.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)


def main(model_dir):
    torch.manual_seed(0)
    tok, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir).eval()
    driver = GateDriver.sara(group_size=8, probe_size=4)
    problems = [("12+30=", 42), ("7+8=", 15), ("40+2=", 42), ("3+3=", 6)]  # the caller chooses the prompts
    trained, groups = [], []
    for prompt_id, (text, answer) in enumerate(problems):
        group = driver.open(text, prompt_id=prompt_id)
        verdict = group.start()  # the probe
        while verdict.kind == "sample":
            completions = sample(model, tok, text, verdict.n)
            rewards = accuracy([text] * len(completions), completions, answer=[answer] * len(completions))
            verdict = group.report(rewards)
        print(f"{text!r}: {verdict.kind} after {group.launched} samples, rewards {group.rewards}")
        (trained if verdict.kind == "train" else groups).append(group)
    # ... your optimizer step on the trained groups' samples goes here ...
    driver.step_done(trained)
    try:
        (trained + groups)[-1].report([1.0])  # a lifecycle mistake: the group has ended
    except LifecycleError as exc:
        print(f"lifecycle error, as it should be: {exc}")


if __name__ == "__main__":
    main(sys.argv[1])
