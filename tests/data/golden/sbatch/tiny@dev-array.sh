#!/bin/bash

# Parameters
#SBATCH --array=0-2%3
#SBATCH --comment=jobctl:<home>/jobs/ID0-tiny/array
#SBATCH --cpus-per-task=2
#SBATCH --error=<home>/jobs/ID0-tiny/array/%A_%a_0_log.err
#SBATCH --gpus-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --job-name=tiny
#SBATCH --mem=7936M
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --output=<home>/jobs/ID0-tiny/array/%A_%a_0_log.out
#SBATCH --partition=gpu
#SBATCH --signal=USR2@30
#SBATCH --time=10
#SBATCH --wckey=submitit

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <home>/jobs/ID0-tiny/array/%A_%a_%t_log.out --error <home>/jobs/ID0-tiny/array/%A_%a_%t_log.err <python> -u -m submitit.core._submit <home>/jobs/ID0-tiny/array
