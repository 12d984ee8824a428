----------------------------- MODULE AccelPact -----------------------------
(***************************************************************************)
(* The AccelPact recovery protocol: keep sharded training alive in memory  *)
(* through a data-plane communication failure.                             *)
(*                                                                         *)
(* Every rank runs the same six-phase machine (Observe, Guard, Agree,      *)
(* Replace, Rebind, Validate).  Its guards are not written here: they are  *)
(* GENERATED from the Python table accelpact/fsm/table.py into             *)
(* AccelPactTable.tla (model_checking/guards.py), and every rank action    *)
(* below is enabled exactly when `Allowed(r, trigger, res)` holds, with    *)
(* each of the table's predicate names read in the spec's terms by `Holds`.*)
(* A guard dropped from the table is therefore either regenerated here and *)
(* model checked, or reported by the conformance check.  The variable      *)
(* `edge` records <<trigger, from, to>> of the last rank step so that      *)
(* tests/test_conformance.py can also compare reachable edges.  Steps of   *)
(* the environment set edge to <<"env:...","","">>.                        *)
(*                                                                         *)
(* The constant Mutant selects a deliberately broken variant ("none" is    *)
(* the real protocol); spec/mutants/*.cfg run each one and name the        *)
(* property it must violate; spec/witnesses/*.cfg name an "interesting     *)
(* state" each property needs to be non-vacuous, which TLC must reach.     *)
(*                                                                         *)
(* Faults modelled: a data-plane fault on any group of `Groups` (chosen    *)
(* per fault), in any failure phase; up to MaxCrashes crashes, at any time *)
(* of a recovery, also after the outcome is written; spurious control-    *)
(* plane timeouts; the control-plane group failing for good (ControlFaults)*)
(* ; up to MaxCuts ranks losing the store (the outcome register) for the   *)
(* rest of the recovery.  A rank that cannot reach the register must not   *)
(* decide alone: it fail-stops without claiming an outcome (Halt).         *)
(* Reductions of the state space, each argued where it is made: commits    *)
(* in rank order within an update (commit_update), one slot the rebind     *)
(* walk may miss (MissableSlot), a subset of failure phases in the larger  *)
(* models (FaultPhases), and fingerprints without `edge` (StateView).      *)
(*                                                                         *)
(* Deferred boundaries (Config.boundary = "deferred", fsm/deferral.py) are *)
(* this protocol, read as follows.  commit_update(r) is the moment r       *)
(* settles the flag it posted, during its next update; until then r has    *)
(* applied nothing of that update (its step waits for the settle), so the  *)
(* stretch between post and settle changes none of these variables, and a  *)
(* rank that joins a recovery instead throws that stretch away first      *)
(* (tests: bitwise equal).  A deferred boundary has no probes: a link that *)
(* breaks there is met in the next update, an uncommitted fault here.  A   *)
(* joiner whose thrown-away collectives failed reports its groups failed:  *)
(* the failed set is the union of reports, as LateFault models.  Trace     *)
(* validation checks real deferred runs against this reading.             *)
(***************************************************************************)
EXTENDS Integers, FiniteSets, Sequences, TLC, AccelPactTable

CONSTANTS
    N,            \* number of ranks; ranks are 0..N-1, rank 0 coordinates the control plane
    Groups,       \* the data-plane groups (sets of ranks); each fault strikes one of them
    Slots,        \* cached reference slots per rank and group (>= 2: a partial rebind is representable)
    MaxFrontier,  \* training is bounded: a rank commits at most MaxFrontier updates
    MaxGen,       \* communicator generations 0..MaxGen: at most MaxGen successful recoveries
    MaxCrashes,   \* how many ranks may crash (stop for good) during recoveries
    MaxCuts,      \* how many ranks may lose the store (the outcome register) during a recovery
    ControlFaults,\* TRUE: the control-plane group itself may fail for good during a recovery
    FaultPhases,  \* failure phases a fault may strike in: the protocol only tells "committed"
                  \* from the rest, so one uncommitted phase stands exactly for all three
    Spurious,     \* TRUE: control-plane timeouts may also fire without a crash (slow peers)
    RewindQualified, \* TRUE: every rank's envelope qualifies Rewind for the uncommitted phases
    PreserveQualified, \* TRUE: every rank may take Preserve (its envelope qualifies it, its guard
                  \* passed); FALSE stands for the reasons decide_agreement rejects a committed
                  \* boundary that this spec does not model (trace validation of such a Reject)
    StepCopy,     \* TRUE: ranks keep a host copy of their state before optimizer.step()
    Mutant        \* "none" or the name of a deliberately broken variant

Ranks == 0 .. (N - 1)

Mutants == {"none", "release_before_validation", "skip_rebind", "local_frontier",
            "unilateral_release", "no_timeout", "preserve_uncommitted", "blind_outcome",
            "rewind_after_step", "rewind_keeps_step", "same_generation",
            "release_keeps_generation", "rewind_stand_by", "local_reject", "proof_by_epoch",
            "one_failed_group", "resume_barrier", "control_failure_resumes",
            "barrier_skips_one_crash"}

(* Phase names: exactly the values of accelpact.fsm.phases.Phase. *)
Phases == {"Train", "Observe", "Guard", "Agree", "Replace", "Rebind", "Validate", "Resume", "Reject"}
(* Failure phases: exactly the values of accelpact.fsm.phases.FailurePhase. *)
FailurePhases == {"forward", "backward", "optimizer", "committed"}

(* The table's triggers, and the tags of steps that are not rank edges. *)
Triggers == {"commit_update", "observe_failure", "join_recovery", "enter_guard", "submit_report",
             "decide_preserve", "decide_rewind", "stand_by", "decide_reject", "replace_comm",
             "replace_failed", "rebind_refs", "rebind_failed", "release", "rewind", "release_reject",
             "abort", "resume_training"}
EnvTags == {"init", "env:decide", "env:resume", "env:timeout", "env:fault", "env:late_fault", "env:crash",
            "env:cut", "env:halt", "env:control"}

ASSUME /\ N \in Nat \ {0}
       /\ Groups \subseteq SUBSET Ranks /\ Groups # {} /\ {} \notin Groups
       /\ Slots # {} /\ IsFiniteSet(Slots)
       /\ MaxFrontier \in Nat /\ MaxGen \in Nat /\ MaxCrashes \in Nat /\ MaxCuts \in Nat
       /\ Mutant \in Mutants
       /\ FaultPhases \subseteq FailurePhases /\ FaultPhases # {}
       /\ Spurious \in BOOLEAN /\ RewindQualified \in BOOLEAN /\ PreserveQualified \in BOOLEAN
       /\ StepCopy \in BOOLEAN
       /\ ControlFaults \in BOOLEAN
       /\ Triggers = TableTriggers   \* the generated guards cover exactly the spec's actions

Gens == 0 .. MaxGen
Frontiers == 0 .. MaxFrontier
GroupsOf(r) == {G \in Groups : r \in G}
NoReport == [f |-> 0, g |-> 0, phi |-> "none", tau |-> 0, copy |-> FALSE]  \* phi = "none": nothing posted
NoDecision == [kind |-> "none", f |-> 0, g |-> 0]
NotResumed == [f |-> -1, g |-> -1, kind |-> "none"]
(* The slot a faulty rebind walk may miss.  Slots are interchangeable, so letting the walk
   miss any one of them only adds symmetric copies of the same behaviours. *)
MissableSlot == CHOOSE s \in Slots : TRUE

VARIABLES
    phase,      \* phase[r]: where rank r's machine stands
    frontier,   \* frontier[r]: F, committed updates held in rank r's memory
    gen,        \* gen[r]: g, the generation rank r works with (its next replacement is g+1)
    refs,       \* refs[r][G][s]: generation of group G's communicator named by r's reference slot s
    validated,  \* validated[r]: r's ok vote for release is posted in the store
    obs,        \* obs[r]: failure phase r saw this recovery ("committed" if it only joined)
    reports,    \* reports[r]: what r posted for frontier agreement
    decision,   \* the one agreement decision, published by rank 0 from all reports
    outcome,    \* the control plane's single outcome register: "none" | "resume" | "reject"
    retired,    \* <<G, g>>: group G's communicator of generation g is destroyed
    crashed,    \* ranks that stopped for good (crashed, or halted without an outcome)
    phi,        \* failure phase of the current fault ("none" before the first fault)
    fr,         \* the groups the current recovery repairs (R): the fault's, and a second group's that
                \* failed before anyone reported (LateFault); {} before the first fault
    resumedAt,  \* ghost: [f, g, kind] rank r held when it resumed (kind: preserve | rewind)
    tau,        \* tau[r]: optimizer steps rank r has applied (frontier[r], or one more mid-update)
    copy,       \* copy[r]: r holds a host copy of its state from before its last step
    cut,        \* ranks that cannot reach the store (the outcome register) any more
    cpDown,     \* the control-plane group has failed for good (no more gathers)
    edge        \* <<trigger, from, to>> of the last rank step (conformance with the table)

vars == <<phase, frontier, gen, refs, validated, obs, reports, decision, outcome,
          retired, crashed, phi, fr, resumedAt, tau, copy, cut, cpDown, edge>>

-----------------------------------------------------------------------------
(* Helpers *)

Alive == Ranks \ crashed
AllTrain == \A r \in Ranks : r \in crashed \/ phase[r] = "Train"
(* A recovery is in progress from the fault until every live rank trains again on a
   resume outcome; after a reject it never ends (fail-stop: the supervisor takes over). *)
Recovering == phi # "none" /\ ~(AllTrain /\ outcome = "resume")
(* The recovery flag every rank checks at its boundary guard (a control-plane read). *)
FlagRaised == outcome = "reject" \/ \E q \in Ranks : obs[q] # "none"
Resumed(r) == resumedAt[r].f >= 0
(* Groups rank r rebuilds: under Rewind every group it holds, under Preserve the failed one. *)
(* Mutant one_failed_group: Preserve repairs one failed group only, as if the decision kept the
   first report's group instead of the union of every rank's. *)
Repaired == IF Mutant = "one_failed_group" /\ fr # {} THEN {CHOOSE G \in fr : TRUE} ELSE fr
Rebuilt(r) == IF decision.kind = "rewind" THEN GroupsOf(r) ELSE GroupsOf(r) \cap Repaired
(* The generation a replacement is built at (mutant same_generation: no increment). *)
NewGen == IF Mutant = "same_generation" THEN decision.g ELSE decision.g + 1
(* The stale-reference proof run after the rebind walk: no slot names a destroyed
   communicator.  Mutant proof_by_epoch compares with this recovery's generation instead,
   which is right only while every group was last rebuilt in the same recovery. *)
ProofPasses(r) ==
    IF Mutant = "proof_by_epoch" THEN \A G \in Rebuilt(r), s \in Slots : refs[r][G][s] # decision.g
    ELSE \A G \in GroupsOf(r), s \in Slots : <<G, refs[r][G][s]>> \notin retired
(* compare_set(outcome, "none", "reject") by rank r; a rank cut off from the store cannot
   write; the blind_outcome mutant overwrites instead. *)
WriteReject(r) ==
    outcome' = IF r \notin cut /\ (outcome = "none" \/ Mutant = "blind_outcome") THEN "reject" ELSE outcome

(* The table's predicates in the spec's terms: rank r, effect results `res` (what the executor
   reports back: [built |-> replacement built?]).  Every name the table uses must be here
   (tests/test_conformance.py).  Only a rank that can reach the store reads the register;
   mutant local_reject: a rank that cannot reach it takes "reject" (the old force_reject). *)
Holds(r, c, res) ==
    CASE c = "decision_is_preserve" -> decision.kind = "preserve"
      [] c = "decision_is_rewind"   -> decision.kind = "rewind"
      [] c = "decision_resumes"     -> decision.kind \in {"preserve", "rewind"}
      [] c = "decision_is_reject"   -> decision.kind = "reject"
      [] c = "in_failed_group"      -> IF decision.kind = "rewind" /\ Mutant # "rewind_stand_by"
                                       THEN GroupsOf(r) # {} ELSE r \in UNION Repaired
      [] c = "replacement_built"    -> res.built
      [] c = "proof_passed"         -> ProofPasses(r) \/ Mutant = "skip_rebind"
      [] c = "outcome_is_resume"    -> IF Mutant = "unilateral_release" THEN \A q \in Ranks : validated[q]
                                       ELSE r \notin cut /\ outcome = "resume"
      [] c = "outcome_is_reject"    -> \/ r \notin cut /\ outcome = "reject"
                                       \/ Mutant = "local_reject" /\ r \in cut

(* The table's conditions, with the one row the rewind_stand_by mutant restores: stand_by
   allowed under Rewind (the table's guard before the audit) and decide_rewind only for
   members of the failed group. *)
Conds(t) ==
    IF Mutant = "rewind_stand_by" /\ t = "stand_by" THEN {"decision_resumes"}
    ELSE IF Mutant = "rewind_stand_by" /\ t = "decide_rewind" THEN {"decision_is_rewind", "in_failed_group"}
    ELSE Conditions(t)

Allowed(r, t, res) ==
    /\ r \notin crashed
    /\ phase[r] \in Sources(t)
    /\ \A c \in Conds(t) : Holds(r, c, res)
    /\ \A u \in Unless(t) : ~Holds(r, u, res)

Ok == [built |-> TRUE]

(* Move rank r along its table row and record the edge. *)
Step(r, t) ==
    /\ phase' = [phase EXCEPT ![r] = Dest(t)]
    /\ edge' = <<t, phase[r], Dest(t)>>

(* decide_agreement of decisions.py, on complete reports: Preserve only if every rank
   failed at a committed boundary and all agree on F, g and tau; Rewind if the update was
   interrupted, all agree on F and g, and every rank that applied the step can undo it
   from its pre-step copy (mutant rewind_after_step: the step is not looked at). *)
AllCommitted == \A r \in Ranks : reports[r].phi = "committed"
SameF == \A r, q \in Ranks : reports[r].f = reports[q].f
SameG == \A r, q \in Ranks : reports[r].g = reports[q].g
SameTau == \A r, q \in Ranks : reports[r].tau = reports[q].tau
StepUndoable(r) == reports[r].tau = reports[r].f \/ reports[r].copy
Decide ==
    IF /\ PreserveQualified
       /\ (AllCommitted \/ Mutant = "preserve_uncommitted")
       /\ (SameF \/ Mutant = "local_frontier")
       /\ SameG /\ (SameTau \/ Mutant \in {"local_frontier", "preserve_uncommitted"})
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
    /\ refs = [r \in Ranks |-> [G \in GroupsOf(r) |-> [s \in Slots |-> 0]]]
    /\ validated = [r \in Ranks |-> FALSE]
    /\ obs = [r \in Ranks |-> "none"]
    /\ reports = [r \in Ranks |-> NoReport]
    /\ decision = NoDecision
    /\ outcome = "none"
    /\ retired = {}
    /\ crashed = {}
    /\ phi = "none"
    /\ fr = {}
    /\ resumedAt = [r \in Ranks |-> NotResumed]
    /\ tau = [r \in Ranks |-> 0]
    /\ copy = [r \in Ranks |-> FALSE]
    /\ cut = {}
    /\ cpDown = FALSE
    /\ edge = <<"init", "", "">>

-----------------------------------------------------------------------------
(* Rank actions: one per trigger of the table, same names. *)

(* A synchronous update commits on every rank, so no rank is more than one update ahead.
   Within one update the ranks commit in rank order: a fault can still strike between any
   two commits, so split frontiers stay reachable, but not every subset of ranks ahead -- a
   reduction from 2^N to N+1 frontier vectors per update, chosen because every split
   frontier takes the same path (agreement sees F differ and rejects).  The boundary check
   runs on the control-plane group: once that has failed, training stops. *)
commit_update(r) ==
    /\ Allowed(r, "commit_update", Ok) /\ crashed = {} /\ ~cpDown
    /\ ~Recovering
    /\ \A q \in Ranks : phase[q] = "Train"
    /\ \A q \in Ranks : IF q < r THEN frontier[q] = frontier[r] + 1 ELSE frontier[q] = frontier[r]
    /\ frontier[r] < MaxFrontier /\ tau[r] = frontier[r]
    /\ Step(r, "commit_update")
    /\ frontier' = [frontier EXCEPT ![r] = @ + 1]
    /\ tau' = [tau EXCEPT ![r] = @ + 1]
    /\ UNCHANGED <<gen, refs, validated, obs, reports, decision, outcome, retired,
                   crashed, phi, fr, resumedAt, copy, cut, cpDown>>

(* The failure phase member r of the failed group reports: phi, except that a member that got
   through its own step before the failure reached it sees the failure at its boundary
   (committed), and a member that had not reached the step when another failed inside it
   sees it mid-backward.  A failure inside the step counts the step as applied (tau = F+1). *)
ObservedPhase(r) ==
    IF phi = "committed" THEN "committed"
    ELSE IF tau[r] = frontier[r] + 1 THEN (IF phi = "optimizer" THEN "optimizer" ELSE "committed")
    ELSE IF phi = "optimizer" THEN "backward" ELSE phi

(* Members of the failed group see the collective fail; mid-update so does every rank that has
   not got through its step (its next collective waits on a rank that is gone from the update). *)
observe_failure(r) ==
    /\ Allowed(r, "observe_failure", Ok)
    /\ r \in UNION fr \/ (phi # "committed" /\ tau[r] = frontier[r])
    /\ Recovering /\ obs[r] = "none"
    /\ Step(r, "observe_failure")
    /\ obs' = [obs EXCEPT ![r] = ObservedPhase(r)]
    /\ UNCHANGED <<frontier, gen, refs, validated, reports, decision, outcome, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* A rank learns of the recovery at its next boundary check, with nothing in flight: a rank
   outside R, or a member of R whose own side saw no error (the rank that skipped a
   collective); such a member joins only once another member of R has a failure on record. *)
join_recovery(r) ==
    /\ Allowed(r, "join_recovery", Ok)
    /\ phi = "committed" \/ tau[r] = frontier[r] + 1  \* at its boundary: it got through its update
    /\ \A G \in fr : r \in G => \E q \in G \ {r} : obs[q] # "none"
    /\ Recovering /\ obs[r] = "none" /\ FlagRaised
    /\ Step(r, "join_recovery")
    /\ obs' = [obs EXCEPT ![r] = "committed"]
    /\ UNCHANGED <<frontier, gen, refs, validated, reports, decision, outcome, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

enter_guard(r) ==
    /\ Allowed(r, "enter_guard", Ok)
    /\ Step(r, "enter_guard")
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

submit_report(r) ==
    /\ Allowed(r, "submit_report", Ok)
    /\ Step(r, "submit_report")
    /\ reports' = [reports EXCEPT ![r] = [f |-> frontier[r], g |-> gen[r], phi |-> obs[r],
                                           tau |-> tau[r], copy |-> copy[r]]]
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, decision, outcome, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* Retire every communicator r is about to rebuild: all generations up to this recovery's. *)
RetireRebuilt(r) == retired' = retired \cup {<<G, x>> : G \in Rebuilt(r), x \in 0 .. decision.g}

(* Preserve agreed and r owns the failed group: destroy the retired communicator. *)
decide_preserve(r) ==
    /\ Allowed(r, "decide_preserve", Ok)
    /\ Step(r, "decide_preserve")
    /\ RetireRebuilt(r)
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* Rewind agreed: every rank discards the update and rebuilds all its groups; the step and the
   snapshot are restored before replace_comm. *)
decide_rewind(r) ==
    /\ Allowed(r, "decide_rewind", Ok)
    /\ Step(r, "decide_rewind")
    /\ RetireRebuilt(r)
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* Vote ok: post it in the store (a rank cut off from the store cannot). *)
VoteOk(r) == validated' = IF r \in cut THEN validated ELSE [validated EXCEPT ![r] = TRUE]

(* Preserve agreed but r is in no failed group: nothing to repair, vote ok and wait. *)
stand_by(r) ==
    /\ Allowed(r, "stand_by", Ok)
    /\ Step(r, "stand_by")
    /\ VoteOk(r)
    /\ UNCHANGED <<frontier, gen, refs, obs, reports, decision, outcome, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

decide_reject(r) ==
    /\ Allowed(r, "decide_reject", Ok)
    /\ Step(r, "decide_reject")
    /\ WriteReject(r)
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* The identical-membership groups are built at generation g+1, then the rebind walk
   redirects the cached references; the walk may miss one slot of one group (it keeps the
   old generation).  Under Rewind the rank has first put its applied step back from the copy
   (mutant rewind_keeps_step: not). *)
replace_comm(r) ==
    /\ Allowed(r, "replace_comm", Ok)
    /\ Step(r, "replace_comm")
    /\ gen' = [gen EXCEPT ![r] = decision.g + 1]
    /\ \E miss \in {{}} \cup {{G} : G \in Rebuilt(r)} :
          refs' = [refs EXCEPT ![r] = [G \in GroupsOf(r) |->
                      IF G \notin Rebuilt(r) THEN refs[r][G]
                      ELSE [s \in Slots |-> IF G \in miss /\ s = MissableSlot THEN refs[r][G][s]
                                            ELSE NewGen]]]
    /\ tau' = IF decision.kind = "rewind" /\ copy[r] /\ Mutant # "rewind_keeps_step"
              THEN [tau EXCEPT ![r] = frontier[r]] ELSE tau
    /\ UNCHANGED <<frontier, validated, obs, reports, decision, outcome, retired,
                   crashed, phi, fr, resumedAt, copy, cut, cpDown>>

(* The replacement could not be built: vote against release. *)
replace_failed(r) ==
    /\ Allowed(r, "replace_failed", [built |-> FALSE])
    /\ Step(r, "replace_failed")
    /\ WriteReject(r)
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* The stale-reference proof passed; in Validate the rank runs an integer all-reduce on the
   new groups and votes: ok if it succeeded, against release (reject) if not. *)
rebind_refs(r) ==
    /\ Allowed(r, "rebind_refs", Ok)
    /\ Step(r, "rebind_refs")
    /\ \/ VoteOk(r) /\ UNCHANGED outcome
       \/ WriteReject(r) /\ UNCHANGED validated
    /\ UNCHANGED <<frontier, gen, refs, obs, reports, decision, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* A stale reference survived the walk: vote against release. *)
rebind_failed(r) ==
    /\ Allowed(r, "rebind_failed", Ok)
    /\ Step(r, "rebind_failed")
    /\ WriteReject(r)
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* Resume at the agreed frontier on generation g+1, once the register says resume.
   Mutant local_frontier: keep the local F instead of the agreed one.  Mutant
   release_keeps_generation: stay on the generation just retired. *)
release(r) ==
    /\ Allowed(r, "release", Ok)
    /\ Step(r, "release")
    /\ LET f == IF Mutant = "local_frontier" THEN frontier[r] ELSE decision.f
           g == IF Mutant = "release_keeps_generation" THEN decision.g ELSE decision.g + 1
       IN /\ frontier' = [frontier EXCEPT ![r] = f]
          /\ gen' = [gen EXCEPT ![r] = g]
          /\ resumedAt' = [resumedAt EXCEPT ![r] = [f |-> f, g |-> g, kind |-> "preserve"]]
    /\ UNCHANGED <<refs, validated, obs, reports, decision, outcome, retired,
                   crashed, phi, fr, tau, copy, cut, cpDown>>

(* Rewind released: resume at the agreed committed F on generation g+1; the interrupted
   update F+1 runs again from the boundary snapshot. *)
rewind(r) ==
    /\ Allowed(r, "rewind", Ok)
    /\ Step(r, "rewind")
    /\ LET g == decision.g + 1
       IN /\ frontier' = [frontier EXCEPT ![r] = decision.f]
          /\ gen' = [gen EXCEPT ![r] = g]
          /\ resumedAt' = [resumedAt EXCEPT ![r] = [f |-> decision.f, g |-> g, kind |-> "rewind"]]
    /\ UNCHANGED <<refs, validated, obs, reports, decision, outcome, retired,
                   crashed, phi, fr, tau, copy, cut, cpDown>>

release_reject(r) ==
    /\ Allowed(r, "release_reject", Ok)
    /\ Step(r, "release_reject")
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

abort(r) ==
    /\ Allowed(r, "abort", Ok)
    /\ Step(r, "abort")
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* Mutant barrier_skips_one_crash: resume_barrier "fixed" by leaving out the rank the failure
   detector reported lost, kept in one slot (the first loss it saw; here any one crashed rank).
   Right with one crash.  Two ranks that crash after their ok votes (every vote is in: rank 0
   still publishes resume) leave one of them waited for forever: the survivor never trains.  A
   lost rank is one of a set, not a slot.  Only a second crash exposes it, and only with a
   survivor: 3 ranks. *)
OneLost == IF crashed = {} THEN {} ELSE {CHOOSE q \in crashed : TRUE}

resume_training(r) ==
    /\ Allowed(r, "resume_training", Ok)
    \* mutant: a resume barrier that waits for every rank, a crashed one included
    /\ Mutant = "resume_barrier" => \A q \in Ranks : phase[q] \in {"Resume", "Train"}
    /\ Mutant = "barrier_skips_one_crash" => \A q \in Ranks \ OneLost : phase[q] \in {"Resume", "Train"}
    /\ Step(r, "resume_training")
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* Mutant control_failure_resumes: a rank that reported and waits for the decision, whose
   control-plane collective failed (the group is down), reads the decision that never comes as
   "nothing to do" and goes back to training at the F it reported.  Only a control-plane
   failure exposes it. *)
ControlFailureResumes(r) ==
    /\ Mutant = "control_failure_resumes" /\ cpDown /\ r \notin crashed
    /\ phase[r] = "Agree" /\ reports[r].phi # "none" /\ decision.kind = "none"
    /\ phase' = [phase EXCEPT ![r] = "Train"]
    /\ resumedAt' = [resumedAt EXCEPT ![r] = [f |-> reports[r].f, g |-> gen[r], kind |-> "preserve"]]
    /\ edge' = <<"resume_training", phase[r], "Train">>
    /\ UNCHANGED <<frontier, gen, refs, validated, obs, reports, decision, outcome, retired,
                   crashed, phi, fr, tau, copy, cut, cpDown>>

(* Every protocol step of rank r (training progress, commit_update, is not required). *)
RankStep(r) ==
    \/ observe_failure(r) \/ join_recovery(r) \/ enter_guard(r) \/ submit_report(r)
    \/ decide_preserve(r) \/ decide_rewind(r) \/ stand_by(r) \/ decide_reject(r)
    \/ replace_comm(r) \/ replace_failed(r) \/ rebind_refs(r) \/ rebind_failed(r)
    \/ release(r) \/ rewind(r) \/ release_reject(r) \/ abort(r) \/ resume_training(r)
    \/ ControlFailureResumes(r)

-----------------------------------------------------------------------------
(* Control plane: rank 0 publishes into the store; not rank edges. *)

EnvStep(name) == edge' = <<"env:" \o name, "", "">>

(* Rank 0 runs decide_agreement once all reports are in (a gather over the control-plane
   group, so not once that group has failed) and publishes the decision. *)
PublishDecision ==
    /\ 0 \notin crashed /\ ~cpDown
    /\ decision.kind = "none" /\ \A r \in Ranks : reports[r].phi # "none"
    /\ decision' = Decide
    /\ EnvStep("decide")
    /\ UNCHANGED <<phase, frontier, gen, refs, validated, obs, reports, outcome, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* Rank 0: compare_set(outcome, "none", "resume") after every rank voted ok.
   Mutant release_before_validation: publish as soon as Preserve is decided. *)
PublishResume ==
    /\ 0 \notin crashed /\ 0 \notin cut
    /\ outcome = "none" /\ Resuming
    /\ (\A r \in Ranks : validated[r]) \/ Mutant = "release_before_validation"
    /\ outcome' = "resume"
    /\ EnvStep("resume")
    /\ UNCHANGED <<phase, frontier, gen, refs, validated, obs, reports, decision, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* Some rank's control-plane wait timed out: compare_set(outcome, "none", "reject").
   It may fire spuriously (a slow peer) at any time during a recovery; it is required to
   fire (fairness) when a peer really stopped, lost the store, or the control-plane group failed. *)
TimeoutCause == crashed # {} \/ cpDown \/ cut # {}
ControlPlaneTimeout ==
    /\ Mutant # "no_timeout"
    /\ Recovering /\ (Spurious \/ TimeoutCause)
    /\ \E r \in Alive \ cut : TRUE   \* someone who can still reach the store writes
    /\ outcome = "none" \/ (Mutant = "blind_outcome" /\ outcome = "resume")
    /\ outcome' = "reject"
    /\ EnvStep("timeout")
    /\ UNCHANGED <<phase, frontier, gen, refs, validated, obs, reports, decision, retired,
                   crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

ControlPlane == PublishDecision \/ PublishResume \/ (ControlPlaneTimeout /\ TimeoutCause)

-----------------------------------------------------------------------------
(* Faults *)

(* A data-plane collective of some group G fails in failure phase p while all ranks train;
   it opens a new recovery (a fresh control-plane prefix: per-recovery state is reset).
   Mid-update (p uncommitted) any set of ranks may already have applied the update's step:
   the split tau of seed 003.  With StepCopy each of them holds its pre-step copy.  Bounded
   by MaxGen so the state space is finite. *)
DataPlaneFailure ==
    /\ ~Recovering
    /\ \A r \in Alive : gen[r] < MaxGen
    /\ \E G \in Groups, p \in FaultPhases, ahead \in SUBSET Ranks :
          /\ fr' = {G}
          /\ phi' = p
          /\ p = "committed" => ahead = {}
          \* someone in G sees it in phase p: mid-forward/backward a member that has not
          \* stepped, inside the step a member that has (ObservedPhase)
          /\ p \in {"forward", "backward"} => \E r \in G : r \notin ahead
          /\ p = "optimizer" => \E r \in G : r \in ahead
          /\ tau' = [r \in Ranks |-> IF r \in ahead THEN frontier[r] + 1 ELSE frontier[r]]
          /\ copy' = [r \in Ranks |-> StepCopy /\ r \in ahead]
    /\ obs' = [r \in Ranks |-> "none"]
    /\ reports' = [r \in Ranks |-> NoReport]
    /\ decision' = NoDecision
    /\ outcome' = "none"
    /\ validated' = [r \in Ranks |-> FALSE]
    /\ resumedAt' = [r \in Ranks |-> NotResumed]
    /\ EnvStep("fault")
    /\ UNCHANGED <<phase, frontier, gen, refs, retired, crashed, cut, cpDown>>

(* A second data-plane fault during a recovery, on another group, before anyone has reported:
   members of that group still at their boundary see it in their health check, and the agreed
   repair is the union of what the ranks saw.  At most one per recovery (two failed groups), so
   the state space stays finite; only where there are two groups to fail. *)
LateFault ==
    /\ Recovering /\ Cardinality(fr) = 1
    /\ \A r \in Ranks : reports[r] = NoReport
    /\ \E G \in Groups \ fr : fr' = fr \cup {G}
    /\ EnvStep("late_fault")
    /\ UNCHANGED <<phase, frontier, gen, refs, validated, obs, reports, decision, outcome, retired,
                   crashed, phi, resumedAt, tau, copy, cut, cpDown>>

(* A rank stops for good at any point of a recovery, also after the outcome is written (a
   crash during training shows up as a data-plane failure followed by this). *)
Crash(r) ==
    /\ Recovering /\ Cardinality(crashed) < MaxCrashes
    /\ r \notin crashed /\ phase[r] # "Reject"
    /\ crashed' = crashed \cup {r}
    /\ EnvStep("crash")
    /\ UNCHANGED <<phase, frontier, gen, refs, validated, obs, reports, decision, outcome,
                   retired, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* Rank r loses the store for the rest of the recovery: it can neither post its vote, nor
   write the register, nor read it. *)
StoreCut(r) ==
    /\ Recovering /\ Cardinality(cut) < MaxCuts
    /\ r \notin crashed /\ r \notin cut /\ phase[r] # "Reject"
    /\ cut' = cut \cup {r}
    /\ EnvStep("cut")
    /\ UNCHANGED <<phase, frontier, gen, refs, validated, obs, reports, decision, outcome,
                   retired, crashed, phi, fr, resumedAt, tau, copy, cpDown>>

(* A rank that waits on the register it cannot reach (in Agree, or in Validate) fail-stops
   without claiming an outcome: it neither resumes nor rejects, it stops like a crash and
   the others follow the register (runtime: release.force_reject retries within the control
   timeout, then OutcomeUnknown). *)
Halt(r) ==
    /\ r \in cut /\ r \notin crashed /\ phase[r] \in {"Agree", "Validate"}
    /\ crashed' = crashed \cup {r}
    /\ EnvStep("halt")
    /\ UNCHANGED <<phase, frontier, gen, refs, validated, obs, reports, decision, outcome,
                   retired, phi, fr, resumedAt, tau, copy, cut, cpDown>>

(* The control-plane group fails for good: no more gathers (agreement, boundary checks);
   the store-backed register still works. *)
ControlGroupFailure ==
    /\ ControlFaults /\ Recovering /\ ~cpDown
    /\ cpDown' = TRUE
    /\ EnvStep("control")
    /\ UNCHANGED <<phase, frontier, gen, refs, validated, obs, reports, decision, outcome,
                   retired, crashed, phi, fr, resumedAt, tau, copy, cut>>

(* Legitimate ends: every live rank rejected (fail-stop), or training with no fault left to
   inject.  Stuttering there is not a deadlock; stuttering anywhere else is a hang. *)
Done ==
    /\ (\A r \in Alive : phase[r] = "Reject") \/ ~Recovering
    /\ UNCHANGED vars

Next ==
    \/ \E r \in Ranks : commit_update(r) \/ RankStep(r) \/ Crash(r) \/ StoreCut(r) \/ Halt(r)
    \/ PublishDecision \/ PublishResume \/ ControlPlaneTimeout \/ ControlGroupFailure
    \/ DataPlaneFailure \/ LateFault
    \/ Done

Fairness == /\ \A r \in Ranks : WF_vars(RankStep(r)) /\ WF_vars(Halt(r))
            /\ WF_vars(ControlPlane)

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* Properties.  Each is stated on what the ranks hold, not on the guard that ensures it. *)

TypeOK ==
    /\ phase \in [Ranks -> Phases]
    /\ frontier \in [Ranks -> Frontiers]
    /\ gen \in [Ranks -> Gens]
    /\ \A r \in Ranks : refs[r] \in [GroupsOf(r) -> [Slots -> Gens]]
    /\ validated \in [Ranks -> BOOLEAN]
    /\ obs \in [Ranks -> FailurePhases \cup {"none"}]
    /\ reports \in [Ranks -> [f : Frontiers, g : Gens, phi : FailurePhases \cup {"none"},
                              tau : 0 .. (MaxFrontier + 1), copy : BOOLEAN]]
    /\ decision \in [kind : {"none", "preserve", "rewind", "reject"}, f : Frontiers, g : Gens]
    /\ outcome \in {"none", "resume", "reject"}
    /\ retired \subseteq Groups \X Gens
    /\ crashed \subseteq Ranks /\ cut \subseteq Ranks /\ cpDown \in BOOLEAN
    /\ phi \in FailurePhases \cup {"none"}
    /\ fr \subseteq Groups
    /\ resumedAt \in [Ranks -> [f : Frontiers \cup {-1}, g : Gens \cup {-1},
                                kind : {"none", "preserve", "rewind"}]]
    /\ tau \in [Ranks -> 0 .. (MaxFrontier + 1)]
    /\ copy \in [Ranks -> BOOLEAN]
    /\ edge \in (Triggers \cup EnvTags) \X (Phases \cup {""}) \X (Phases \cup {""})

(* Nobody resumes while a live peer has not finished its repair: no live rank is still before
   Validate when one resumes (a peer that rejected is OutcomeAgreement's business).  Excludes a release
   published before the repairs were done (release_before_validation). *)
ValidatedBeforeRelease ==
    \A r \in Alive : phase[r] = "Resume" =>
        \A q \in Alive : phase[q] \notin {"Observe", "Guard", "Agree", "Replace", "Rebind"}

(* All-or-nothing: never one rank resumed while another rejected in the same recovery.
   Excludes a release without the register (unilateral_release), a timeout that overwrites
   it (blind_outcome), a rank that decides reject alone when it cannot read it (local_reject). *)
OutcomeAgreement ==
    ~ \E r, q \in Ranks : Resumed(r) /\ phase[q] = "Reject"

(* Ranks leaving a recovery hold the same F and g: read from the ranks' own frontier and
   generation, not from the decision.  Excludes resuming at a local frontier (local_frontier). *)
NoSplitFrontier ==
    \A r, q \in Alive : phase[r] = "Resume" /\ phase[q] = "Resume" =>
        frontier[r] = frontier[q] /\ gen[r] = gen[q]

(* No rank that trains (or is about to) holds a reference, in any of its groups, to a
   destroyed communicator.  Excludes releasing a partial rebind (skip_rebind) and a proof
   that checks the wrong generation (proof_by_epoch). *)
NoStaleReference ==
    \A r \in Alive : phase[r] \in {"Train", "Resume"} =>
        \A G \in GroupsOf(r), s \in Slots : <<G, refs[r][G][s]>> \notin retired

(* No rank that trains (or is about to) works at a generation whose communicators of its
   groups were destroyed: its next replacement would reuse a retired store prefix.
   Excludes a release that keeps the retired generation (release_keeps_generation). *)
NoRetiredGeneration ==
    \A r \in Alive : phase[r] \in {"Train", "Resume"} =>
        \A G \in GroupsOf(r) : <<G, gen[r]>> \notin retired

(* A rank that votes ok under Rewind holds generation g+1 in every slot of every group:
   a rewind discards the update everywhere, so every group is rebuilt, not only the failed
   one.  Excludes ranks outside R standing by under Rewind (rewind_stand_by). *)
RewindRebuildsEveryGroup ==
    \A r \in Alive : validated[r] /\ decision.kind = "rewind" =>
        \A G \in GroupsOf(r), s \in Slots : refs[r][G][s] = decision.g + 1

(* Preserve resumes exactly where the failure struck: at a committed boundary, at the
   frontier the rank held at failure, so no update is replayed or half-applied.  Rewind
   resumes at the committed F it reported: only the interrupted update runs again.
   Excludes preserving an interrupted update (preserve_uncommitted). *)
ZeroReplay ==
    \A r \in Ranks : Resumed(r) => /\ resumedAt[r].f = reports[r].f
                                   /\ resumedAt[r].kind = "preserve" => phi = "committed"

(* No rank re-applies an update: a rewound rank holds exactly F applied steps (its real tau)
   until the re-run of F+1 commits.  Excludes rewinding a step nobody can undo
   (rewind_after_step) and rewinding without restoring the copy (rewind_keeps_step). *)
NoReapply ==
    \A r \in Ranks : resumedAt[r].kind = "rewind" /\ frontier[r] = resumedAt[r].f => tau[r] = frontier[r]

(* A rank that resumed after a Preserve holds the new generation in every slot of every failed
   group it belongs to: all failed groups were repaired, not only one.  Excludes repairing only
   the first reported group when a second one failed before agreement (one_failed_group). *)
FailedGroupsRebuilt ==
    \A r \in Ranks : Resumed(r) /\ resumedAt[r].kind = "preserve" =>
        \A G \in fr \cap GroupsOf(r) : \A s \in Slots : refs[r][G][s] = resumedAt[r].g

(* Every recovery ends: each rank trains again, rejects or has stopped.  Excludes a hang
   (no_timeout), also one after the release: a rank released but held before training, by a
   resume barrier that waits for a peer which crashed after the outcome (resume_barrier). *)
Settled ==
    \A r \in Ranks : \/ r \in crashed
                     \/ phase[r] = "Reject"
                     \/ outcome = "resume" /\ phase[r] = "Train"
RecoveryEnds == (phi # "none") ~> Settled

-----------------------------------------------------------------------------
(* Witnesses: "interesting states" stated negated, so TLC must VIOLATE each (spec/witnesses/).
   Without them a property could hold only because nothing it talks about is reachable. *)

(* ResumePossible: some recovery resumes (checked with no crash and no spurious timeout, so a
   protocol that never resumes fails it: same_generation). *)
NoResumeEver == ~ \E r \in Ranks : Resumed(r)
NoRewindEver == ~ \E r \in Ranks : resumedAt[r].kind = "rewind"
(* Two ranks in Resume at once (NoSplitFrontier, ValidatedBeforeRelease talk about this). *)
NeverTwoResume == ~ \E r, q \in Ranks : r # q /\ phase[r] = "Resume" /\ phase[q] = "Resume"
(* A rank trains on rebuilt references after a communicator was retired (NoStaleReference,
   NoRetiredGeneration). *)
NeverTrainsRebuilt == ~ \E r \in Ranks : phase[r] = "Train" /\ Resumed(r) /\ retired # {}
(* Under Rewind a rank outside the failed group votes ok (RewindRebuildsEveryGroup). *)
NeverRewindOutsideR == ~ \E r \in Ranks : validated[r] /\ decision.kind = "rewind" /\ r \notin UNION fr
(* A rewind after a step undone from the copy (NoReapply). *)
NeverRewindsCopiedStep == ~ \E r \in Ranks : resumedAt[r].kind = "rewind" /\ reports[r].tau # reports[r].f
(* A second fault strikes a different group than the first (R chosen per fault): a rank
   holds two groups at different generations. *)
NeverGroupsDiverge == ~ \E r \in Ranks : \E G, H \in GroupsOf(r) : refs[r][G][MissableSlot] # refs[r][H][MissableSlot]
(* Fault witnesses: each added fault is reached, and the protocol still ends. *)
NeverTwoCrashes == Cardinality(crashed) < 2
NeverCrashAfterResume == ~ (outcome = "resume" /\ \E r \in crashed : ~Resumed(r) /\ \E q \in Ranks : Resumed(q))
NeverHaltWhileOthersResume == ~ (\E r \in cut \cap crashed : \E q \in Ranks : Resumed(q))
NeverTwoGroupsRepaired == ~ (Cardinality(fr) = 2 /\ \E r \in Ranks : Resumed(r) /\ resumedAt[r].kind = "preserve")
NeverControlFailureReject == ~ (cpDown /\ \A r \in Alive : phase[r] = "Reject")

(* The state without the history variable `edge`: TLC fingerprints states by this VIEW in
   the property checks (`edge` is read by no guard and no property, so checking modulo it
   is exact).  The conformance run, which needs every edge, does not use the VIEW. *)
StateView == <<phase, frontier, gen, refs, validated, obs, reports, decision, outcome,
               retired, crashed, phi, fr, resumedAt, tau, copy, cut, cpDown>>

=============================================================================
