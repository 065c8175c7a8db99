#!/bin/bash

# Parameters
#SBATCH --comment=jobctl:<home>/jobs/ID-llama8b
#SBATCH --cpus-per-task=128
#SBATCH --error=<home>/jobs/ID-llama8b/%j_0_log.err
#SBATCH --gpus-per-node=8
#SBATCH --gres=gpu:8
#SBATCH --job-name=llama8b
#SBATCH --mem=1000G
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --output=<home>/jobs/ID-llama8b/%j_0_log.out
#SBATCH --partition=gpu
#SBATCH --signal=USR2@30
#SBATCH --time=720
#SBATCH --wckey=submitit

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <home>/jobs/ID-llama8b/%j_%t_log.out --error <home>/jobs/ID-llama8b/%j_%t_log.err <python> -u -m submitit.core._submit <home>/jobs/ID-llama8b
