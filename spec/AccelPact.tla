----------------------------- MODULE AccelPact -----------------------------
(***************************************************************************)
(* The AccelPact recovery protocol: keep sharded training alive in memory  *)
(* through a data-plane communication failure.                             *)
(*                                                                         *)
(* Every rank runs the same six-phase machine (Observe, Guard, Agree,      *)
(* Replace, Rebind, Validate) whose edges are the rows of the Python table *)
(* accelpact/fsm/table.py -- that table is the source of truth.  Each rank *)
(* action below is named exactly like the table's trigger and moves the    *)
(* rank's phase exactly along the table's edge; the variable `edge`        *)
(* records <<trigger, from, to>> of the last rank step so that             *)
(* tests/test_conformance.py can read the set of edges back out of a TLC   *)
(* state dump and compare it with table.edges().  Steps of the environment *)
(* (faults, crashes, control-plane writes) set edge to <<"env:...","","">> *)
(* and are ignored by that comparison.                                     *)
(*                                                                         *)
(* The constant Mutant selects a deliberately broken variant ("none" is    *)
(* the real protocol); spec/mutants/*.cfg run each one and name the        *)
(* property it must violate, which proves the properties have teeth.       *)
(*                                                                         *)
(* Modelling choices (what the table leaves to the executor):              *)
(*  - members of R see the data-plane failure (observe_failure, reporting  *)
(*    the fault's phase phi); the others join at their next boundary check *)
(*    once the recovery flag is up and report "committed";                 *)
(*  - rank 0 publishes the agreement decision and, after every vote is ok, *)
(*    compare_set(outcome, "none", "resume"); a failing rank or a control- *)
(*    plane timeout does compare_set(outcome, "none", "reject");           *)
(*  - a rank that stands by votes ok: it has no failed group to validate;  *)
(*  - Reject is terminal: fail-stop, the supervisor restarts from a        *)
(*    checkpoint (outside this model).                                     *)
(* Rewind (beyond the paper): an update interrupted in forward, backward   *)
(* or the optimizer step is discarded on every rank and re-run from F,     *)
(* provided no rank keeps an applied step (tau = F, or a pre-step copy     *)
(* puts it back); every rank rebuilds its groups (decide_rewind).          *)
(* Reductions of the state space, each argued where it is made: commits    *)
(* in rank order within an update (commit_update), one slot the rebind     *)
(* walk may miss (MissableSlot), crashes only before the outcome is        *)
(* written (Crash), a subset of failure phases in the larger models        *)
(* (FaultPhases), and fingerprints without `edge` (StateView).             *)
(***************************************************************************)
EXTENDS Integers, FiniteSets, Sequences, TLC   \* Sequences for \o on strings

CONSTANTS
    N,            \* number of ranks; ranks are 0..N-1, rank 0 coordinates the control plane
    R,            \* the replication subgroup whose data-plane communicator fails
    Slots,        \* cached reference slots per member of R (>= 2: a partial rebind is representable)
    MaxFrontier,  \* training is bounded: a rank commits at most MaxFrontier updates
    MaxGen,       \* communicator generations 0..MaxGen: at most MaxGen successful recoveries
    MaxCrashes,   \* how many ranks may crash (stop for good) during recoveries
    FaultPhases,  \* failure phases a fault may strike in: the protocol only tells "committed"
                  \* from the rest, so one uncommitted phase stands exactly for all three
    Spurious,     \* TRUE: control-plane timeouts may also fire without a crash (slow peers)
    RewindQualified, \* TRUE: every rank's envelope qualifies Rewind for the uncommitted phases
    StepCopy,     \* TRUE: ranks keep a host copy of their state before optimizer.step()
    Mutant        \* "none" or the name of a deliberately broken variant

Ranks == 0 .. (N - 1)

Mutants == {"none", "release_before_validation", "skip_rebind", "local_frontier",
            "unilateral_release", "no_timeout", "preserve_uncommitted", "blind_outcome",
            "rewind_after_step", "rewind_keeps_step"}

(* Phase names: exactly the values of accelpact.fsm.phases.Phase. *)
Phases == {"Train", "Observe", "Guard", "Agree", "Replace", "Rebind", "Validate", "Resume", "Reject"}
(* Failure phases: exactly the values of accelpact.fsm.phases.FailurePhase. *)
FailurePhases == {"forward", "backward", "optimizer", "committed"}
(* Sources of the table's `abort` row: only Agree waits on the control plane before Validate. *)
AbortSources == {"Agree"}

(* The table's triggers, and the tags of steps that are not rank edges. *)
Triggers == {"commit_update", "observe_failure", "join_recovery", "enter_guard", "submit_report",
             "decide_preserve", "decide_rewind", "stand_by", "decide_reject", "replace_comm",
             "replace_failed", "rebind_refs", "rebind_failed", "release", "rewind", "release_reject",
             "abort", "resume_training"}
EnvTags == {"init", "env:decide", "env:resume", "env:timeout", "env:fault", "env:crash"}

ASSUME /\ N \in Nat \ {0}
       /\ R \subseteq Ranks /\ R # {}
       /\ Slots # {} /\ IsFiniteSet(Slots)
       /\ MaxFrontier \in Nat /\ MaxGen \in Nat /\ MaxCrashes \in Nat
       /\ Mutant \in Mutants
       /\ FaultPhases \subseteq FailurePhases /\ FaultPhases # {}
       /\ Spurious \in BOOLEAN /\ RewindQualified \in BOOLEAN /\ StepCopy \in BOOLEAN

Gens == 0 .. MaxGen
Frontiers == 0 .. MaxFrontier
NoReport == [f |-> 0, g |-> 0, phi |-> "none", tau |-> 0, copy |-> FALSE]  \* phi = "none": nothing posted
NoDecision == [kind |-> "none", f |-> 0, g |-> 0]
NotResumed == [f |-> -1, g |-> -1, kind |-> "none"]
(* The slot a faulty rebind walk may miss.  Slots are interchangeable, so letting the walk
   miss any one of them only adds symmetric copies of the same behaviours. *)
MissableSlot == CHOOSE s \in Slots : TRUE

VARIABLES
    phase,      \* phase[r]: where rank r's machine stands
    frontier,   \* frontier[r]: F, committed updates held in rank r's memory
    gen,        \* gen[r]: g, the communicator generation rank r works with
    refs,       \* refs[r][s], r \in R: generation named by cached reference slot s
    validated,  \* validated[r]: r voted ok for release (validated its groups / stood by)
    obs,        \* obs[r]: failure phase r saw this recovery ("committed" if it only joined)
    reports,    \* reports[r]: what r posted for frontier agreement
    decision,   \* the one agreement decision, published by rank 0 from all reports
    outcome,    \* the control plane's single outcome register: "none" | "resume" | "reject"
    live,       \* generations of the failed group's communicator that exist
    retired,    \* generations destroyed: no reference may name them after recovery
    crashed,    \* ranks that stopped for good
    phi,        \* failure phase of the current fault ("none" before the first fault)
    resumedAt,  \* ghost: [f, g, kind] rank r held when it resumed (kind: preserve | rewind)
    tau,        \* tau[r]: optimizer steps rank r has applied (frontier[r], or one more mid-update)
    copy,       \* copy[r]: r holds a host copy of its state from before its last step
    edge        \* <<trigger, from, to>> of the last rank step (conformance with the table)

vars == <<phase, frontier, gen, refs, validated, obs, reports, decision, outcome,
          live, retired, crashed, phi, resumedAt, tau, copy, edge>>

-----------------------------------------------------------------------------
(* Helpers *)

Alive == Ranks \ crashed
AllTrain == \A r \in Ranks : r \in crashed \/ phase[r] = "Train"
(* A recovery is in progress from the fault until every live rank trains again on a
   resume outcome; after a reject it never ends (fail-stop: the supervisor takes over). *)
Recovering == phi # "none" /\ ~(AllTrain /\ outcome = "resume")
(* The recovery flag every rank checks at its boundary guard (a control-plane read). *)
FlagRaised == outcome = "reject" \/ \E q \in Ranks : obs[q] # "none"
Posted(r) == reports[r].phi # "none"
Resumed(r) == resumedAt[r].f >= 0
(* The stale-reference proof run after the rebind walk. *)
ProofPasses(r) == r \in R => \A s \in Slots : refs[r][s] \notin retired
(* compare_set(outcome, "none", "reject"); the blind_outcome mutant overwrites instead. *)
WriteReject == outcome' = IF outcome = "none" \/ Mutant = "blind_outcome" THEN "reject" ELSE outcome

(* Move rank r along one edge of the table and record the edge. *)
Step(r, trigger, to) ==
    /\ phase' = [phase EXCEPT ![r] = to]
    /\ edge' = <<trigger, phase[r], to>>

(* decide_agreement of decisions.py, on complete reports: Preserve only if every rank
   failed at a committed boundary and all agree on F and g; Rewind if the update was
   interrupted, all agree on F and g, and every rank that applied the step can undo it
   from its pre-step copy (mutant rewind_after_step: the step is not looked at). *)
AllCommitted == \A r \in Ranks : reports[r].phi = "committed"
SameF == \A r, q \in Ranks : reports[r].f = reports[q].f
SameG == \A r, q \in Ranks : reports[r].g = reports[q].g
StepUndoable(r) == reports[r].tau = reports[r].f \/ reports[r].copy
Decide ==
    IF /\ (AllCommitted \/ Mutant = "preserve_uncommitted")
       /\ (SameF \/ Mutant = "local_frontier")
       /\ SameG
    THEN [kind |-> "preserve", f |-> reports[0].f, g |-> reports[0].g]
    ELSE IF /\ RewindQualified /\ ~AllCommitted /\ SameF /\ SameG
            /\ (\A r \in Ranks : StepUndoable(r)) \/ Mutant = "rewind_after_step"
    THEN [kind |-> "rewind", f |-> reports[0].f, g |-> reports[0].g]
    ELSE [kind |-> "reject", f |-> 0, g |-> 0]
Resuming == decision.kind \in {"preserve", "rewind"}

-----------------------------------------------------------------------------
Init ==
    /\ phase = [r \in Ranks |-> "Train"]
    /\ frontier = [r \in Ranks |-> 0]
    /\ gen = [r \in Ranks |-> 0]
    /\ refs = [r \in R |-> [s \in Slots |-> 0]]
    /\ validated = [r \in Ranks |-> FALSE]
    /\ obs = [r \in Ranks |-> "none"]
    /\ reports = [r \in Ranks |-> NoReport]
    /\ decision = NoDecision
    /\ outcome = "none"
    /\ live = {0}
    /\ retired = {}
    /\ crashed = {}
    /\ phi = "none"
    /\ resumedAt = [r \in Ranks |-> NotResumed]
    /\ tau = [r \in Ranks |-> 0]
    /\ copy = [r \in Ranks |-> FALSE]
    /\ edge = <<"init", "", "">>

-----------------------------------------------------------------------------
(* Rank actions: one per trigger of the table, same names. *)

(* A synchronous update commits on every rank, so no rank is more than one update ahead.
   Within one update the ranks commit in rank order: a fault can still strike between any
   two commits, so split frontiers (some ranks one update ahead, members of R and others)
   stay reachable, but not every subset of ranks ahead -- a reduction of the state space
   from 2^N to N+1 frontier vectors per update, chosen because every split frontier takes
   the same path (agreement sees F differ and rejects). *)
commit_update(r) ==
    /\ r \notin crashed /\ crashed = {}
    /\ phase[r] = "Train" /\ ~Recovering
    /\ \A q \in Ranks : phase[q] = "Train"
    /\ \A q \in Ranks : IF q < r THEN frontier[q] = frontier[r] + 1 ELSE frontier[q] = frontier[r]
    /\ frontier[r] < MaxFrontier /\ tau[r] = frontier[r]
    /\ Step(r, "commit_update", "Train")
    /\ frontier' = [frontier EXCEPT ![r] = @ + 1]
    /\ tau' = [tau EXCEPT ![r] = @ + 1]
    /\ UNCHANGED <<gen, refs, validated, obs, reports, decision, outcome, live, retired,
                   crashed, phi, resumedAt, copy>>

(* The failure phase member r of the failed group reports: phi, except that a member that got
   through its own step before the failure reached it sees the failure at its boundary
   (committed), and a member that had not reached the step when another failed inside it
   sees it mid-backward.  A failure inside the step counts the step as applied (tau = F+1):
   it may be half done. *)
ObservedPhase(r) ==
    IF phi = "committed" THEN "committed"
    ELSE IF tau[r] = frontier[r] + 1 THEN (IF phi = "optimizer" THEN "optimizer" ELSE "committed")
    ELSE IF phi = "optimizer" THEN "backward" ELSE phi

(* Members of the failed group see the collective fail; mid-update so does every rank that has
   not got through its step (its next collective waits on a rank that is gone from the update). *)
observe_failure(r) ==
    /\ r \notin crashed
    /\ r \in R \/ (phi # "committed" /\ tau[r] = frontier[r])
    /\ phase[r] = "Train" /\ Recovering /\ obs[r] = "none"
    /\ Step(r, "observe_failure", "Observe")
    /\ obs' = [obs EXCEPT ![r] = ObservedPhase(r)]
    /\ UNCHANGED <<frontier, gen, refs, validated, reports, decision, outcome, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

(* A rank learns of the recovery at its next boundary check, with nothing in flight (so, mid-
   update, only a rank that got through its step can join; the others observe): a rank
   outside R, or a member of R whose own side saw no error (its peer timed out waiting for it,
   e.g. the rank that skipped a collective). Such a member joins only once another member of
   R has a failure on record, so a failed group always has an observer. *)
join_recovery(r) ==
    /\ r \notin crashed
    /\ phi = "committed" \/ tau[r] = frontier[r] + 1  \* at its boundary: it got through its update
    /\ r \in R => \E q \in R \ {r} : obs[q] # "none"
    /\ phase[r] = "Train" /\ Recovering /\ obs[r] = "none" /\ FlagRaised
    /\ Step(r, "join_recovery", "Observe")
    /\ obs' = [obs EXCEPT ![r] = "committed"]
    /\ UNCHANGED <<frontier, gen, refs, validated, reports, decision, outcome, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

enter_guard(r) ==
    /\ r \notin crashed /\ phase[r] = "Observe"
    /\ Step(r, "enter_guard", "Guard")
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

submit_report(r) ==
    /\ r \notin crashed /\ phase[r] = "Guard"
    /\ Step(r, "submit_report", "Agree")
    /\ reports' = [reports EXCEPT ![r] = [f |-> frontier[r], g |-> gen[r], phi |-> obs[r],
                                           tau |-> tau[r], copy |-> copy[r]]]
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, decision, outcome, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

(* Preserve agreed and r owns the failed group: destroy the retired communicator. *)
decide_preserve(r) ==
    /\ r \notin crashed /\ r \in R
    /\ phase[r] = "Agree" /\ decision.kind = "preserve"
    /\ Step(r, "decide_preserve", "Replace")
    /\ retired' = retired \cup {decision.g}
    /\ live' = live \ {decision.g}
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome,
                   crashed, phi, resumedAt, tau, copy>>

(* Rewind agreed: every rank discards the update and rebuilds all its groups (the failed one is
   retired like under Preserve); the step and the snapshot are restored before replace_comm. *)
decide_rewind(r) ==
    /\ r \notin crashed
    /\ phase[r] = "Agree" /\ decision.kind = "rewind"
    /\ Step(r, "decide_rewind", "Replace")
    /\ retired' = retired \cup {decision.g}
    /\ live' = live \ {decision.g}
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome,
                   crashed, phi, resumedAt, tau, copy>>

(* Preserve agreed but r is in no failed group: nothing to repair, vote ok and wait. *)
stand_by(r) ==
    /\ r \notin crashed /\ r \notin R
    /\ phase[r] = "Agree" /\ decision.kind = "preserve"
    /\ Step(r, "stand_by", "Validate")
    /\ validated' = [validated EXCEPT ![r] = TRUE]
    /\ UNCHANGED <<frontier, gen, refs, obs, reports, decision, outcome, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

decide_reject(r) ==
    /\ r \notin crashed
    /\ phase[r] = "Agree" /\ decision.kind = "reject"
    /\ Step(r, "decide_reject", "Reject")
    /\ WriteReject
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

(* The identical-membership group is built at generation g+1, then the rebind walk
   redirects the cached references; the walk may miss one slot (it stays on g).  Under Rewind
   the rank has first put its applied step back from the copy (mutant rewind_keeps_step: not). *)
replace_comm(r) ==
    /\ r \notin crashed /\ phase[r] = "Replace"
    /\ Step(r, "replace_comm", "Rebind")
    /\ gen' = [gen EXCEPT ![r] = decision.g + 1]
    /\ live' = live \cup {decision.g + 1}
    /\ IF r \in R
         THEN \E miss \in {{}, {MissableSlot}} :
                refs' = [refs EXCEPT ![r] = [s \in Slots |-> IF s \in miss THEN refs[r][s]
                                                                       ELSE decision.g + 1]]
         ELSE UNCHANGED refs
    /\ tau' = IF decision.kind = "rewind" /\ copy[r] /\ Mutant # "rewind_keeps_step"
              THEN [tau EXCEPT ![r] = frontier[r]] ELSE tau
    /\ UNCHANGED <<frontier, validated, obs, reports, decision, outcome, retired,
                   crashed, phi, resumedAt, copy>>

(* The replacement could not be built: vote against release. *)
replace_failed(r) ==
    /\ r \notin crashed /\ phase[r] = "Replace"
    /\ Step(r, "replace_failed", "Validate")
    /\ WriteReject
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

(* The stale-reference proof passed; in Validate the rank runs an integer all-reduce on the
   new group and votes: ok if it succeeded, against release (reject) if not.
   Mutant skip_rebind: the proof is not run, so a missed slot goes unnoticed. *)
rebind_refs(r) ==
    /\ r \notin crashed /\ phase[r] = "Rebind"
    /\ ProofPasses(r) \/ Mutant = "skip_rebind"
    /\ Step(r, "rebind_refs", "Validate")
    /\ \/ /\ validated' = [validated EXCEPT ![r] = TRUE]
          /\ UNCHANGED outcome
       \/ /\ WriteReject
          /\ UNCHANGED validated
    /\ UNCHANGED <<frontier, gen, refs, obs, reports, decision, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

(* A stale reference survived the walk: vote against release. *)
rebind_failed(r) ==
    /\ r \notin crashed /\ phase[r] = "Rebind"
    /\ ~ProofPasses(r)
    /\ Step(r, "rebind_failed", "Validate")
    /\ WriteReject
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

(* Resume at the agreed frontier on generation g+1, once the register says resume.
   Mutant unilateral_release: release on seeing every vote ok, ignoring the register.
   Mutant local_frontier: keep the local F instead of the agreed one. *)
release(r) ==
    /\ r \notin crashed /\ phase[r] = "Validate" /\ decision.kind = "preserve"
    /\ IF Mutant = "unilateral_release"
         THEN \A q \in Ranks : validated[q]
         ELSE outcome = "resume"
    /\ Step(r, "release", "Resume")
    /\ LET f == IF Mutant = "local_frontier" THEN frontier[r] ELSE decision.f
           g == decision.g + 1
       IN /\ frontier' = [frontier EXCEPT ![r] = f]
          /\ gen' = [gen EXCEPT ![r] = g]
          /\ resumedAt' = [resumedAt EXCEPT ![r] = [f |-> f, g |-> g, kind |-> "preserve"]]
    /\ UNCHANGED <<refs, validated, obs, reports, decision, outcome, live, retired,
                   crashed, phi, tau, copy>>

(* Rewind released: resume at the agreed committed F on generation g+1; the interrupted
   update F+1 runs again from the boundary snapshot. *)
rewind(r) ==
    /\ r \notin crashed /\ phase[r] = "Validate" /\ decision.kind = "rewind"
    /\ outcome = "resume"
    /\ Step(r, "rewind", "Resume")
    /\ LET g == decision.g + 1
       IN /\ frontier' = [frontier EXCEPT ![r] = decision.f]
          /\ gen' = [gen EXCEPT ![r] = g]
          /\ resumedAt' = [resumedAt EXCEPT ![r] = [f |-> decision.f, g |-> g, kind |-> "rewind"]]
    /\ UNCHANGED <<refs, validated, obs, reports, decision, outcome, live, retired,
                   crashed, phi, tau, copy>>

release_reject(r) ==
    /\ r \notin crashed /\ phase[r] = "Validate" /\ outcome = "reject"
    /\ Step(r, "release_reject", "Reject")
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

abort(r) ==
    /\ r \notin crashed /\ phase[r] \in AbortSources /\ outcome = "reject"
    /\ Step(r, "abort", "Reject")
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

resume_training(r) ==
    /\ r \notin crashed /\ phase[r] = "Resume"
    /\ Step(r, "resume_training", "Train")
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

(* Every protocol step of rank r (training progress, commit_update, is not required). *)
RankStep(r) ==
    \/ observe_failure(r) \/ join_recovery(r) \/ enter_guard(r) \/ submit_report(r)
    \/ decide_preserve(r) \/ decide_rewind(r) \/ stand_by(r) \/ decide_reject(r)
    \/ replace_comm(r) \/ replace_failed(r) \/ rebind_refs(r) \/ rebind_failed(r)
    \/ release(r) \/ rewind(r) \/ release_reject(r) \/ abort(r) \/ resume_training(r)

-----------------------------------------------------------------------------
(* Control plane: rank 0 publishes into the store; not rank edges. *)

EnvStep(name) == edge' = <<"env:" \o name, "", "">>

(* Rank 0 runs decide_agreement once all reports are in and publishes the decision. *)
PublishDecision ==
    /\ 0 \notin crashed
    /\ decision.kind = "none" /\ \A r \in Ranks : Posted(r)
    /\ decision' = Decide
    /\ EnvStep("decide")
    /\ UNCHANGED <<phase, frontier, gen, refs, validated, obs, reports, outcome, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

(* Rank 0: compare_set(outcome, "none", "resume") after every rank voted ok.
   Mutant release_before_validation: publish as soon as Preserve is decided. *)
PublishResume ==
    /\ 0 \notin crashed
    /\ outcome = "none" /\ Resuming
    /\ (\A r \in Ranks : validated[r]) \/ Mutant = "release_before_validation"
    /\ outcome' = "resume"
    /\ EnvStep("resume")
    /\ UNCHANGED <<phase, frontier, gen, refs, validated, obs, reports, decision, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

(* A rank's control-plane wait timed out: compare_set(outcome, "none", "reject").
   It may fire spuriously (a slow peer) at any time during a recovery; it is only
   required to fire (fairness) when a peer really crashed. *)
ControlPlaneTimeout ==
    /\ Mutant # "no_timeout"
    /\ Recovering /\ (Spurious \/ crashed # {})
    /\ outcome = "none" \/ (Mutant = "blind_outcome" /\ outcome = "resume")
    /\ WriteReject
    /\ EnvStep("timeout")
    /\ UNCHANGED <<phase, frontier, gen, refs, validated, obs, reports, decision, live, retired,
                   crashed, phi, resumedAt, tau, copy>>

ControlPlane == PublishDecision \/ PublishResume \/ (ControlPlaneTimeout /\ crashed # {})

-----------------------------------------------------------------------------
(* Faults *)

(* A data-plane collective of group R fails in failure phase p while all ranks train;
   it opens a new recovery (a fresh control-plane prefix: per-recovery state is reset).
   Mid-update (p uncommitted) any set of ranks may already have applied the update's step
   (they got through before the failure reached them): the split tau of seed 003.  With
   StepCopy each of them holds its pre-step copy.  Bounded by MaxGen so the state space is
   finite. *)
DataPlaneFailure ==
    /\ ~Recovering
    /\ \A r \in Alive : gen[r] < MaxGen
    /\ \E p \in FaultPhases, ahead \in SUBSET Ranks :
          /\ phi' = p
          /\ p = "committed" => ahead = {}
          \* someone in R sees it in phase p: mid-forward/backward a member that has not
          \* stepped, inside the step a member that has (ObservedPhase)
          /\ p \in {"forward", "backward"} => \E r \in R : r \notin ahead
          /\ p = "optimizer" => \E r \in R : r \in ahead
          /\ tau' = [r \in Ranks |-> IF r \in ahead THEN frontier[r] + 1 ELSE frontier[r]]
          /\ copy' = [r \in Ranks |-> StepCopy /\ r \in ahead]
    /\ obs' = [r \in Ranks |-> "none"]
    /\ reports' = [r \in Ranks |-> NoReport]
    /\ decision' = NoDecision
    /\ outcome' = "none"
    /\ validated' = [r \in Ranks |-> FALSE]
    /\ resumedAt' = [r \in Ranks |-> NotResumed]
    /\ EnvStep("fault")
    /\ UNCHANGED <<phase, frontier, gen, refs, live, retired, crashed>>

(* A rank stops for good at any point of a recovery before its outcome is written (a crash
   during training shows up as a data-plane failure followed by this; a crash after the
   outcome is written changes nothing for the others, who follow the register). *)
Crash(r) ==
    /\ Recovering /\ outcome = "none" /\ Cardinality(crashed) < MaxCrashes
    /\ r \notin crashed /\ phase[r] # "Reject"
    /\ crashed' = crashed \cup {r}
    /\ EnvStep("crash")
    /\ UNCHANGED <<phase, frontier, gen, refs, validated, obs, reports, decision, outcome,
                   live, retired, phi, resumedAt, tau, copy>>

(* Legitimate ends: every live rank rejected (fail-stop), or training with no fault left to
   inject.  Stuttering there is not a deadlock; stuttering anywhere else is a hang. *)
Done ==
    /\ (\A r \in Alive : phase[r] = "Reject") \/ ~Recovering
    /\ UNCHANGED vars

Next ==
    \/ \E r \in Ranks : commit_update(r) \/ RankStep(r) \/ Crash(r)
    \/ PublishDecision \/ PublishResume \/ ControlPlaneTimeout
    \/ DataPlaneFailure
    \/ Done

Fairness == /\ \A r \in Ranks : WF_vars(RankStep(r))
            /\ WF_vars(ControlPlane)

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* Properties *)

TypeOK ==
    /\ phase \in [Ranks -> Phases]
    /\ frontier \in [Ranks -> Frontiers]
    /\ gen \in [Ranks -> Gens]
    /\ refs \in [R -> [Slots -> Gens]]
    /\ validated \in [Ranks -> BOOLEAN]
    /\ obs \in [Ranks -> FailurePhases \cup {"none"}]
    /\ reports \in [Ranks -> [f : Frontiers, g : Gens, phi : FailurePhases \cup {"none"},
                              tau : 0 .. (MaxFrontier + 1), copy : BOOLEAN]]
    /\ decision \in [kind : {"none", "preserve", "rewind", "reject"}, f : Frontiers, g : Gens]
    /\ outcome \in {"none", "resume", "reject"}
    /\ live \subseteq Gens /\ retired \subseteq Gens
    /\ crashed \subseteq Ranks
    /\ phi \in FailurePhases \cup {"none"}
    /\ resumedAt \in [Ranks -> [f : Frontiers \cup {-1}, g : Gens \cup {-1},
                                kind : {"none", "preserve", "rewind"}]]
    /\ tau \in [Ranks -> 0 .. (MaxFrontier + 1)]
    /\ copy \in [Ranks -> BOOLEAN]
    /\ edge \in (Triggers \cup EnvTags) \X (Phases \cup {""}) \X (Phases \cup {""})

(* All ranks that resumed from this recovery hold the same F and g. *)
NoSplitFrontier ==
    \A r, q \in Ranks : Resumed(r) /\ Resumed(q) => resumedAt[r] = resumedAt[q]

(* No rank that trains (or is about to) holds a reference to a retired communicator. *)
NoStaleReference ==
    \A r \in R : phase[r] \in {"Train", "Resume"} => \A s \in Slots : refs[r][s] \notin retired

(* Nobody resumes before every rank validated and voted ok. *)
ValidatedBeforeRelease ==
    \A r \in Ranks : Resumed(r) => \A q \in Ranks : validated[q]

(* All-or-nothing: never one rank resumed while another rejected in the same recovery. *)
OutcomeAgreement ==
    ~ \E r, q \in Ranks : Resumed(r) /\ phase[q] = "Reject"

(* Preserve resumes exactly where the failure struck: at a committed boundary, at the
   frontier the rank held at failure, so no update is replayed or half-applied.  Rewind
   resumes at the committed F it reported: only the interrupted update runs again. *)
ZeroReplay ==
    \A r \in Ranks : Resumed(r) => /\ resumedAt[r].f = reports[r].f
                                   /\ resumedAt[r].kind = "preserve" => phi = "committed"

(* A rewind never follows an applied step: a rank that had applied the interrupted update's
   step without a copy to undo it never rewinds. *)
RewindNeverAfterStep ==
    \A r \in Ranks : resumedAt[r].kind = "rewind" => ~(reports[r].tau # reports[r].f /\ ~reports[r].copy)

(* No rank re-applies an update: a rewound rank holds exactly F applied steps until the re-run
   of F+1 commits, so that re-run applies F+1 once. *)
NoReapply ==
    \A r \in Ranks : resumedAt[r].kind = "rewind" /\ frontier[r] = resumedAt[r].f => tau[r] = frontier[r]

(* Every recovery ends: each rank resumes, rejects or has crashed. *)
Settled ==
    \A r \in Ranks : \/ r \in crashed
                     \/ phase[r] = "Reject"
                     \/ outcome = "resume" /\ phase[r] \in {"Resume", "Train"}
RecoveryEnds == (phi # "none") ~> Settled

(* The state without the history variable `edge`: TLC fingerprints states by this VIEW in
   the property checks.  `edge` is written by every step and read by no guard and no
   property, so states that differ only in it have the same futures; checking modulo it
   is exact and divides the state count by about three.  The conformance run, which
   needs every edge, does not use the VIEW. *)
StateView == <<phase, frontier, gen, refs, validated, obs, reports, decision, outcome,
               live, retired, crashed, phi, resumedAt, tau, copy>>

=============================================================================
