---------------------------- MODULE AccelPactTable ----------------------------
(* GENERATED from accelpact/fsm/table.py by model_checking/guards.py -- do not edit;     *)
(* regenerate with `accelpact check --write-table`.  Each trigger's source phases,      *)
(* destination, conditions (all must hold) and unless entries (none may hold).           *)

TableTriggers == {"commit_update", "observe_failure", "join_recovery", "enter_guard", "submit_report", "decide_preserve", "decide_rewind", "stand_by", "decide_reject", "replace_comm", "replace_failed", "rebind_refs", "rebind_failed", "release", "rewind", "release_reject", "abort", "resume_training"}
Sources(t) == CASE
       t = "commit_update" -> {"Train"}
    [] t = "observe_failure" -> {"Train"}
    [] t = "join_recovery" -> {"Train"}
    [] t = "enter_guard" -> {"Observe"}
    [] t = "submit_report" -> {"Guard"}
    [] t = "decide_preserve" -> {"Agree"}
    [] t = "decide_rewind" -> {"Agree"}
    [] t = "stand_by" -> {"Agree"}
    [] t = "decide_reject" -> {"Agree"}
    [] t = "replace_comm" -> {"Replace"}
    [] t = "replace_failed" -> {"Replace"}
    [] t = "rebind_refs" -> {"Rebind"}
    [] t = "rebind_failed" -> {"Rebind"}
    [] t = "release" -> {"Validate"}
    [] t = "rewind" -> {"Validate"}
    [] t = "release_reject" -> {"Validate"}
    [] t = "abort" -> {"Agree"}
    [] t = "resume_training" -> {"Resume"}
Dest(t) == CASE
       t = "commit_update" -> "Train"
    [] t = "observe_failure" -> "Observe"
    [] t = "join_recovery" -> "Observe"
    [] t = "enter_guard" -> "Guard"
    [] t = "submit_report" -> "Agree"
    [] t = "decide_preserve" -> "Replace"
    [] t = "decide_rewind" -> "Replace"
    [] t = "stand_by" -> "Validate"
    [] t = "decide_reject" -> "Reject"
    [] t = "replace_comm" -> "Rebind"
    [] t = "replace_failed" -> "Validate"
    [] t = "rebind_refs" -> "Validate"
    [] t = "rebind_failed" -> "Validate"
    [] t = "release" -> "Resume"
    [] t = "rewind" -> "Resume"
    [] t = "release_reject" -> "Reject"
    [] t = "abort" -> "Reject"
    [] t = "resume_training" -> "Train"
Conditions(t) == CASE
       t = "commit_update" -> {}
    [] t = "observe_failure" -> {}
    [] t = "join_recovery" -> {}
    [] t = "enter_guard" -> {}
    [] t = "submit_report" -> {}
    [] t = "decide_preserve" -> {"decision_is_preserve", "in_failed_group"}
    [] t = "decide_rewind" -> {"decision_is_rewind"}
    [] t = "stand_by" -> {"decision_is_preserve"}
    [] t = "decide_reject" -> {"decision_is_reject"}
    [] t = "replace_comm" -> {"replacement_built"}
    [] t = "replace_failed" -> {}
    [] t = "rebind_refs" -> {"proof_passed"}
    [] t = "rebind_failed" -> {}
    [] t = "release" -> {"outcome_is_resume", "decision_is_preserve"}
    [] t = "rewind" -> {"outcome_is_resume", "decision_is_rewind"}
    [] t = "release_reject" -> {"outcome_is_reject"}
    [] t = "abort" -> {"outcome_is_reject"}
    [] t = "resume_training" -> {}
Unless(t) == CASE
       t = "commit_update" -> {}
    [] t = "observe_failure" -> {}
    [] t = "join_recovery" -> {}
    [] t = "enter_guard" -> {}
    [] t = "submit_report" -> {}
    [] t = "decide_preserve" -> {}
    [] t = "decide_rewind" -> {}
    [] t = "stand_by" -> {"in_failed_group"}
    [] t = "decide_reject" -> {}
    [] t = "replace_comm" -> {}
    [] t = "replace_failed" -> {"replacement_built"}
    [] t = "rebind_refs" -> {}
    [] t = "rebind_failed" -> {"proof_passed"}
    [] t = "release" -> {}
    [] t = "rewind" -> {}
    [] t = "release_reject" -> {}
    [] t = "abort" -> {}
    [] t = "resume_training" -> {}

(* Whether trigger t may fire from phase ph, predicate names read through P. *)
TableAllows(t, ph, P(_)) ==
    /\ ph \in Sources(t)
    /\ \A c \in Conditions(t) : P(c)
    /\ \A u \in Unless(t) : ~P(u)
=============================================================================
