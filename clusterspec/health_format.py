"""The task-health watchdog's contract with whoever started the tasks
(`estimator_accum.distribution.health` writes it, `tfconfig launch` and
the engines read it)."""

# A task that lost a peer exits with this code (the launcher names the lost
# peer and restarts the job).
PEER_LOST_EXIT = 150
# A task of a MultiWorkerMirroredStrategy job whose session failed and would
# be made anew alone (its peers would wait in the old one's collectives):
# it exits instead, and the job restarts whole from its last checkpoint.
SESSION_LOST_EXIT = 151
# A task that waited in one step or save past its progress bound while it
# lived: collectives that never meet, a save that never ends.
NO_PROGRESS_EXIT = 152
# A task that finds the model_dir is not the one its peers see (EX_CONFIG).
MODEL_DIR_NOT_SHARED_EXIT = 78
# The marker files each training task rewrites while it lives, in model_dir.
MARKER_DIR = ".estimator_accum_tasks"
