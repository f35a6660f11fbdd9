# Phase markers for the CI scripts (sourced by .ci/run and scripts/*.sh; not run on its own).
#
#   phase "LABEL"   closes the running phase (if any) and starts LABEL
#   phase_end       closes the running phase (scripts call it on exit, through the trap
#                   phase_init sets)
#
# Each start prints one line, `== HH:MM:SS +ELAPSED s SCRIPT: LABEL`, where ELAPSED counts
# from the start of the whole run (RAFTER_PHASE_T0, exported so nested scripts share it), so
# a log shows where the time went and where a hung run stopped. Each closed phase appends
# `SECONDS  SCRIPT: LABEL` to RAFTER_PHASE_LOG when that is set; .ci/run prints that file as
# its summary.

: "${RAFTER_PHASE_T0:=$(date +%s)}"
export RAFTER_PHASE_T0
_phase_script=${0##*/}
_phase_label=""
_phase_start=0

phase_end() {
  local now
  now=$(date +%s)
  if [[ -n $_phase_label ]]; then
    if [[ -n ${RAFTER_PHASE_LOG:-} ]]; then
      printf '%5d s  %s: %s\n' $((now - _phase_start)) "$_phase_script" "$_phase_label" \
        >>"$RAFTER_PHASE_LOG"
    fi
    _phase_label=""
  fi
}

phase() {
  phase_end
  _phase_label=$1
  _phase_start=$(date +%s)
  echo "== $(date +%T) +$((_phase_start - RAFTER_PHASE_T0)) s $_phase_script: $_phase_label"
}

# Closes the last phase when the script exits (on success or failure), keeping whatever
# EXIT trap the script sets later in charge of its own cleanup: scripts that trap EXIT
# themselves call phase_end from their trap.
trap phase_end EXIT
