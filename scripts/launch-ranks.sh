# Sourced by scripts/train.sh and scripts/finetune.sh: launch_ranks N PROGRAM ARGS... runs PROGRAM
# on N ranks under mpirun so that Ctrl-C (or SIGTERM to the script) stops them the way fsdp-train
# stops cleanly: every rank saves a checkpoint at the end of its step and exits.
#
# Why not mpirun in the foreground: Open MPI puts each rank in a process group of its own, so the
# terminal's Ctrl-C reaches mpirun alone, and mpirun answers SIGINT or SIGTERM by sending its ranks
# SIGTERM after odls_base_sigkill_timeout (1 s) and SIGKILL 1 s later: a rank still saving is killed.
# SIGUSR1, which mpirun relays to its ranks at once and survives, asks fsdp-train the same thing.
# So mpirun runs in a process group of its own (standard input from /dev/null: a background group
# reading the terminal would be stopped), and the script relays the first stop signal to it as
# SIGUSR1, a second one as SIGTERM (mpirun's own stop, for a job that does not stop).
launch_ranks() {
  local ranks=$1
  shift
  local mpi_env=()
  if [ "$(id -u)" = 0 ]; then mpi_env=(-x OMPI_ALLOW_RUN_AS_ROOT=1 -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1); fi
  local launcher stops=0 status=0
  set -m
  mpirun --oversubscribe --bind-to none -np "$ranks" "${mpi_env[@]}" "$@" < /dev/null &
  launcher=$!
  set +m
  # shellcheck disable=SC2064
  trap 'stops=$((stops + 1)); if [ $stops -eq 1 ]; then kill -USR1 '"$launcher"' 2>/dev/null; else kill -TERM '"$launcher"' 2>/dev/null; fi' INT TERM
  while true; do
    status=0
    wait "$launcher" || status=$?
    # wait returns early (status > 128) when a trapped signal arrives; the job is still running then.
    kill -0 "$launcher" 2>/dev/null || break
  done
  # The job may have ended while a signal interrupted wait: bash still holds its status.
  local final=0
  wait "$launcher" 2>/dev/null || final=$?
  [ "$final" -eq 127 ] || status=$final
  trap - INT TERM
  # Stopped on request: the job saved and exited 0, but what follows it in a script (an export)
  # must not run on a half-trained model. 130, as a shell's Ctrl-C.
  [ "$stops" -eq 0 ] || return 130
  return "$status"
}
