# The judge of the GRPO run in docs/grpo_cycle.md: the base model fine-tuned whole as a discriminator that pools over
# all positions (the seed's frozen last-token recipe sees nothing on this corpus; see
# docs/reward_model_training_infrastructure.md). About 7 minutes for 8,000 samples of N=128 on 2 cores of an AMD EPYC
# (PyTorch 2.13.0; the run and its date in that doc).
# python train_reward_model.py config/train_reward_shakespeare_char.py --model_path=BASE.pt --data_dir=DATA --out_path=RM.pt
reward_pooling = 'mean'
unfreeze_layers = 4  # every block of the 4-layer default model
learning_rate = 3e-4
batch_size = 32
max_iters = 1500
eval_interval = 250
