# GRPO of the default cycle's base model against the mean-pooled judge (docs/grpo_cycle.md): about 2 minutes on 2
# cores of an AMD EPYC (PyTorch 2.13.0; the run and its date in docs/grpo_cycle.md).
# python train_grpo.py config/grpo_shakespeare_char.py --policy_path=BASE.pt --reward_model_path=RM.pt --out_path=NEW.pt
max_steps = 100
prompts_per_step = 8
num_generations = 8
learning_rate = 5e-5
beta = 0.4  # a strong pull to the reference: the judge is weak, and what it rewards is partly not naturalness
eval_interval = 25
ppl_max_tokens = 0  # val perplexity on the whole split, as evaluate.py reports it
