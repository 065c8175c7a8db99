#!/bin/bash

# Parameters
#SBATCH --comment=jobctl:<home>/jobs/ID-llama3.2-1b-a10g
#SBATCH --cpus-per-task=48
#SBATCH --error=<home>/jobs/ID-llama3.2-1b-a10g/%j_0_log.err
#SBATCH --gpus-per-node=4
#SBATCH --gres=gpu:4
#SBATCH --job-name=llama3.2-1b-a10g
#SBATCH --mem=186G
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --output=<home>/jobs/ID-llama3.2-1b-a10g/%j_0_log.out
#SBATCH --partition=g5
#SBATCH --signal=USR2@30
#SBATCH --time=60
#SBATCH --wckey=submitit

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <home>/jobs/ID-llama3.2-1b-a10g/%j_%t_log.out --error <home>/jobs/ID-llama3.2-1b-a10g/%j_%t_log.err <python> -u -m submitit.core._submit <home>/jobs/ID-llama3.2-1b-a10g
