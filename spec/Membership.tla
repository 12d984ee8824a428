----------------------------- MODULE Membership -----------------------------
(***************************************************************************)
(* AccelPact membership change: a lost rank is replaced by a hot spare     *)
(* (issue 15).  A module of its own: the in-world repair (Preserve,        *)
(* Rewind, rebind) is AccelPact.tla's business; this one models who holds  *)
(* which position of which world, at the same level of abstraction.        *)
(*                                                                         *)
(* W active positions 0..W-1 (the ranks of the training world), each held  *)
(* by one process; S spare processes W..W+S-1 wait without a position.  A  *)
(* shared store of compare-and-set registers survives everything (losing   *)
(* the store's host is out of scope: the runtime rejects it).  World epoch *)
(* e has its own process groups; a process trains only in its own world.   *)
(*                                                                         *)
(* One membership change, epoch e -> e+1:                                  *)
(* - a loss (CRASH: gone for good; PARTITION: alive, cut off from its      *)
(*   peers and the store, may reach the store again later) breaks world e; *)
(* - survivors detect it (their collective fails) and post PRESENT(e,      *)
(*   position, frontier F, applied, atCheck) in the store;                 *)
(* - the first present survivor whose wait ends (all W present, or its     *)
(*   deadline: at any time) writes the MEMBERSHIP REGISTER of e            *)
(*   (compare-and-set, first write wins) with a decision computed only     *)
(*   from the reports it read (and the small-state slots in the store):    *)
(*   REPLACE (each lost position -> a free spare and a source position     *)
(*   from its replica set; the agreed F) or REJECT (no spare, no live      *)
(*   replica, frontiers that cannot be agreed, a lost rank's small state   *)
(*   of F missing);                                                        *)
(* - everyone obeys the register: a process whose position is not in the   *)
(*   decided present set is FENCED (it exits when it reads the register,   *)
(*   e.g. a partitioned process reaching the store again, or a survivor    *)
(*   whose PRESENT came late); each assigned spare takes its lost position *)
(*   (and the lost rank's global id);                                      *)
(* - every member of world e+1 builds its groups on a fresh prefix (world  *)
(*   e is retired for it), the source sends the lost shard to the spare    *)
(*   with a digest (a transfer may arrive corrupted: the check fails),     *)
(*   every member validates and votes, and the RELEASE REGISTER of e+1 is  *)
(*   written once: resume iff every member voted ok, else reject (a failed *)
(*   vote, a deadline); on reject every process exits (exit 75).           *)
(*                                                                         *)
(* Survivors restore their boundary snapshot when they join (an update in  *)
(* flight is re-run by everyone: Rewind semantics), so the source sends    *)
(* the state at F (the agreed F: see roll forward below).                  *)
(*                                                                         *)
(* THE BOUNDARY CHECK AND ROLL FORWARD.  Update F+1 ends with a check: an  *)
(* all-reduce of a clean flag over every member (Enter: the body ran, the  *)
(* step is applied; before its contribution leaves, the rank writes its    *)
(* SMALL STATE of F+1 -- RNG, data cursor, schedulers: what lives on that  *)
(* rank only -- to the store, acknowledged).  A rank commits F+1 when the  *)
(* all-reduce completes on it, which needs every member's contribution     *)
(* (Commit).  So a loss between two commits leaves survivors at F and F+1, *)
(* and then every member (the lost one too) entered the check of F+1 and   *)
(* wrote its small state of F+1 (SplitOnlyAtCheck).  A survivor that       *)
(* entered the check and never learned its outcome reports atCheck; when   *)
(* the reports stand at F and F+1 and every one at F is atCheck, the       *)
(* decision ROLLS FORWARD to F+1: those survivors commit F+1 locally when  *)
(* they join (their state is F+1's), the others restore F+1.  Any other    *)
(* difference of frontiers rejects.  The store keeps two small-state slots *)
(* per position, by frontier parity (a rank writes F+1 while a decision    *)
(* that nobody committed F+1 in still needs F); a spare reads the slot of  *)
(* the agreed F and refuses another frontier (its vote fails), and the     *)
(* decision rejects a lost position whose slot does not hold F.            *)
(*                                                                         *)
(* Further losses may strike a released world (e+1 -> e+2) or a recovery   *)
(* in progress (a member of e+1 lost before its vote: the release rejects; *)
(* one lost after its ok vote is found by the next collective: a new       *)
(* change).                                                                *)
(*                                                                         *)
(* Not modelled: a partition that strikes a process during a recovery (a   *)
(* crash stands for it there: it stops taking part, and a partitioned      *)
(* member that reaches the store reads a release that can only be reject); *)
(* a partition that heals towards the store but not the peers (a healed    *)
(* process reaches both); the deadline of the release only expires when a  *)
(* member is lost or a vote failed unless Spurious.                        *)
(*                                                                         *)
(* The constant Mutant selects a deliberately broken variant ("none" is    *)
(* the protocol); spec/membership/mutants/*.cfg name the property each     *)
(* must violate, spec/membership/witnesses/*.cfg the states TLC must       *)
(* reach; spec/membership/MC3.cfg and MC4.cfg are the models that pass.    *)
(*                                                                         *)
(* SHRINK (Shrink = TRUE, the runtime's Config.on_loss="shrink", opt-in):  *)
(* when too few spares are free for the lost positions, the decision may   *)
(* go on with fewer replicas instead.  A REPLICA GROUP is the positions    *)
(* that together hold one whole copy of the model (derived from Replicas:  *)
(* the c-th member of every replica set; in 2x2 HSDP with replica sets     *)
(* {0,2} and {1,3} the groups are {0,1} and {2,3}).  A shrink keeps the    *)
(* groups whose members are all present; every present position of a      *)
(* broken group LEAVES (phase Left: it exits cleanly, never trains again); *)
(* a lost one is fenced as by a Replace.  World e+1 holds the kept         *)
(* positions only: its size and replica count shrink.  Refused (reject)    *)
(* when no group is whole: a shard would have no live holder.  Otherwise   *)
(* as a Replace: the agreed F (rolled forward as above, else reject on     *)
(* split frontiers), survivors restore F (or commit it), build e+1, re-run *)
(* F+1, vote, release.  The runtime renumbers                              *)
(* the kept ranks 0..W'-1 in order and translates every group's rank list  *)
(* with that map, so each keeps its index in its group and its shard; the  *)
(* spec names them by their old positions (same groups, same shards).     *)
(* Every member records, when it builds its world, the world size and     *)
(* replica count its gradient average divides by (avgOver).               *)
(*                                                                         *)
(* Properties about train events (FencedNeverTrains,                       *)
(* NoTrainOnRetiredWorld) are read from ghost sets filled by the step that *)
(* writes a "train" record: a slow member may still sit in Train, or       *)
(* resume, when a register already fenced it, unable to train (its world's *)
(* collectives fail), so the phase alone cannot tell a fenced process that *)
(* trains from one that has not noticed yet.                               *)
(***************************************************************************)
EXTENDS Integers, FiniteSets

CONSTANTS
    W,            \* active positions 0..W-1
    S,            \* spare processes W..W+S-1
    Replicas,     \* the replica sets: a partition of the positions (a shard coordinate each)
    CopyStride,   \* neighbour copies (issue 16): 0 none; else an unreplicated position i's state is
                  \* copied to position (i + CopyStride) % W's memory (the runtime's ring)
    MaxLosses,    \* at most this many losses (crashes and partitions) in a run
    MaxFrontier,  \* training is bounded: at most MaxFrontier committed updates
    Corruption,   \* TRUE: a state transfer may arrive corrupted (its digest check fails)
    InFlight,     \* TRUE: a loss may strike mid-update: members finish an update (enter its check)
                  \* one at a time, and a survivor may hold the step applied before it entered
    Spurious,     \* TRUE: a release deadline may expire while every member is still coming
    Shrink,       \* TRUE: every rank runs with on_loss="shrink" (go on with fewer replicas)
    Mutant        \* "none" or the name of a deliberately broken variant

Positions == 0 .. (W - 1)
Spares == W .. (W + S - 1)
Procs == 0 .. (W + S - 1)
Epochs == 0 .. MaxLosses      \* every membership change needs a loss of its own
Frontiers == 0 .. MaxFrontier
None == -1                    \* no position / no world / no process
NoShard == -1                 \* a spare's memory before the transfer
Corrupt == -2                 \* a state whose digest does not match

Mutants == {"none", "release_before_transfer_verified", "partition_not_fenced",
            "two_claim_one_position", "transfer_from_non_replica", "frontier_split",
            "blind_release", "train_on_old_world", "late_present_joins", "stale_neighbour_copy",
            "spare_claimed_twice", "shrink_without_holder", "shrink_keeps_broken_group",
            "stale_average", "leaver_trains", "newest_small_state", "commit_without_all"}

Min(X) == CHOOSE x \in X : \A y \in X : x <= y
ReplicaOf(i) == CHOOSE R \in Replicas : i \in R
ShardOf(i) == Min(ReplicaOf(i))   \* the shard coordinate a position holds: its replica set's id
(* <<i, h>>: position h's memory keeps the neighbour copy of position i, a position no replica
   peer shares a shard with (replicate="neighbour" sends nothing where a replica holds it). *)
Copies == IF CopyStride = 0 THEN {}
          ELSE {<<i, (i + CopyStride) % W>> : i \in {j \in Positions : ReplicaOf(j) = {j}}}
(* The k-th smallest element of X (k from 0). *)
Nth(X, k) == CHOOSE x \in X : Cardinality({y \in X : y < x}) = k
ShardIds == {ShardOf(i) : i \in Positions}
(* Replica groups (shard groups): the positions that hold one whole copy of the model together.
   The k-th member of every replica set belongs to group k (2x2 HSDP, replica sets {0,2} {1,3}:
   groups {0,1} {2,3}; DDP {{0,1}}: {0} and {1}; fully sharded {{0},{1},{2}}: {0,1,2}).  Only
   for a uniform mesh (replica sets of one size: the runtime refuses to shrink another); a
   non-uniform one counts as one group. *)
Uniform == \A R1, R2 \in Replicas : Cardinality(R1) = Cardinality(R2)
IndexIn(i) == Cardinality({j \in ReplicaOf(i) : j < i})   \* i's replica coordinate
GroupOf(i) == IF Uniform THEN {j \in Positions : IndexIn(j) = IndexIn(i)} ELSE Positions
Groups == {GroupOf(i) : i \in Positions}
(* What a gradient average over the positions X divides by: the world size, the replica count. *)
AvgOf(X) == [size |-> Cardinality(X), replicas |-> Cardinality({G \in Groups : G \subseteq X})]
NoAvg == [size |-> 0, replicas |-> 0]   \* a spare before it builds a world

ASSUME /\ W \in Nat \ {0} /\ S \in Nat /\ MaxLosses \in Nat /\ MaxFrontier \in Nat
       /\ UNION Replicas = Positions /\ {} \notin Replicas
       /\ \A R1, R2 \in Replicas : R1 = R2 \/ R1 \cap R2 = {}
       /\ Corruption \in BOOLEAN /\ InFlight \in BOOLEAN /\ Spurious \in BOOLEAN
       /\ Shrink \in BOOLEAN /\ (Shrink => Uniform)
       /\ Mutant \in Mutants
       /\ CopyStride \in Nat /\ (CopyStride % W # 0 \/ CopyStride = 0)

Phases == {"Spare",   \* a spare waiting for an assignment
           "Train",   \* in the training loop of world[p] (blocked if its world is broken)
           "Wait",    \* posted PRESENT, waiting for the membership register
           "Cut",     \* partitioned: reaches neither its peers nor the store
           "Build",   \* member of world[p] (new), building its groups, transferring, validating
           "Voted",   \* voted, waiting for the release register
           "Exit",    \* fenced: learned it was replaced, exited for good
           "Left",    \* left a shrink with its broken replica group: exited cleanly, for good
           "Reject",  \* fail-stop (exit 75)
           "Dead"}    \* crashed

NoReport == [proc |-> None, f |-> 0, applied |-> FALSE, atCheck |-> FALSE, held |-> None]
NoDecision == [kind |-> "none", present |-> {}, positions |-> {}, holder |-> [i \in Positions |-> None],
               src |-> [i \in Positions |-> None], f |-> 0, rewind |-> FALSE, why |-> "none"]
Slots == {0, 1}   \* the two small-state slots of a position, by frontier parity
NotResumed == [w |-> None, f |-> 0, stepped |-> FALSE]

VARIABLES
    phase,     \* phase[p]
    pos,       \* pos[p]: the position p holds (a spare takes the lost rank's id), None for a spare
    world,     \* world[p]: the world epoch p belongs to (None for a spare)
    frontier,  \* frontier[p]: committed updates in p's memory
    stepped,   \* stepped[p]: p holds the in-flight update's step applied (not committed)
    entered,   \* entered[p]: p finished update frontier[p]+1 and contributed to its boundary check
               \* (its small state of frontier[p]+1 is in the store), outcome not learned yet
    shard,     \* shard[p]: the shard coordinate of the state in p's memory (NoShard, Corrupt)
    groups,    \* groups[p]: the world whose groups p built last (older ones retired)
    refs,      \* refs[p]: the world whose groups p's training loop uses
    vote,      \* vote[p]: "none" | "ok" | "fail", p's release vote in world[p]
    rep,       \* rep[e][i]: PRESENT report of position i in epoch e (store)
    reg,       \* reg[e]: the membership register of epoch e (store)
    rel,       \* rel[e]: the release register of world e (store); world 0 starts released
    small,     \* small[i][k]: the frontier of position i's small state in slot k (store), None if none
    losses,    \* losses so far
    \* ghosts (read by the properties only)
    seen,      \* seen[p][e]: the membership decision of e that p acted on
    relSeen,   \* relSeen[p][e]: the release value of world e that p acted on
    claims,    \* claims[e]: <<position, process>> for every process that took a position in world e
    notReady,  \* notReady[e]: members of world e not validated when release=resume was written
    zombie,    \* processes that wrote a train record while fenced
    stale,     \* processes that wrote a train record outside their world or in a superseded one
    resumedAt, \* resumedAt[p]: [w, f, stepped] of p's last train record after a release
    held,      \* held[p]: the frontier of the newest complete neighbour copy in p's memory
               \* (of the position <<i, pos[p]>> \in Copies names), None if none arrived yet
    avgOver,   \* avgOver[p]: [size, replicas] p's gradient average divides by (set when it builds)
    staleAvg,  \* processes that wrote a train record averaging over another world than theirs
    leftTrained, \* processes that wrote a train record after a shrink told them to leave
    sstate     \* sstate[p]: the frontier of the small state p applied as a spare taking over a lost
               \* position (None otherwise; reset when p joins a later world as a survivor)

procVars == <<phase, pos, world, frontier, stepped, entered, shard, groups, refs, vote, held, avgOver, sstate>>
vars == <<phase, pos, world, frontier, stepped, entered, shard, groups, refs, vote, rep, reg, rel, small, losses,
          seen, relSeen, claims, notReady, zombie, stale, resumedAt, held, avgOver, staleAvg,
          leftTrained, sstate>>

-----------------------------------------------------------------------------
(* Helpers *)

(* The positions of world e: all of them in world 0, else those the decision that formed it kept
   (a Replace all of its world's, a shrink its whole replica groups). *)
WorldPositions(e) == IF e = 0 THEN Positions ELSE reg[e - 1].positions
(* What a gradient average in world e must divide by. *)
Avg(e) == AvgOf(WorldPositions(e))

(* Position i of world e is held by a process that trains (or is released to). *)
HeldLive(e, i) == \E q \in Procs : /\ <<i, q>> \in claims[e] /\ world[q] = e
                                   /\ \/ phase[q] = "Train"
                                      \/ phase[q] = "Voted" /\ rel[e] = "resume"
(* A collective of world e fails: some position is no longer held by a training process. *)
Broken(e) == \E i \in WorldPositions(e) : ~HeldLive(e, i)

Present(e) == {i \in Positions : rep[e][i].proc # None}
(* Spares named by earlier registers (the decider reads them in the store). *)
Assigned(d) == IF d.kind = "replace" THEN {d.holder[i] : i \in d.positions \ d.present} ELSE {}
(* Mutant spare_claimed_twice: the pool forgets the claims of earlier changes (only a second
   loss can meet a spare claimed before). *)
FreeSpares(e) == IF Mutant = "spare_claimed_twice" THEN Spares
                 ELSE Spares \ UNION {Assigned(reg[x]) : x \in 0 .. (e - 1)}
(* Where the lost shard of position i may come from: a present member of its replica set, or
   a present holder of its neighbour copy that reported a complete copy at the agreed frontier
   f (a copy of another update would put the spare out of step with its peers).  Mutant
   transfer_from_non_replica: any present position; stale_neighbour_copy: a copy of any
   frontier. *)
ReplicaSources(e, i) == IF Mutant = "transfer_from_non_replica" THEN Present(e)
                        ELSE Present(e) \cap ReplicaOf(i)
CopySources(e, i, f) == {h \in Present(e) : /\ <<i, h>> \in Copies /\ rep[e][h].held # None
                                             /\ (rep[e][h].held = f \/ Mutant = "stale_neighbour_copy")}
SourcesOf(e, i, f) == IF ReplicaSources(e, i) # {} THEN ReplicaSources(e, i) ELSE CopySources(e, i, f)
(* The copy holder of position h is a neighbour (not a replica) source of i. *)
ViaCopy(i, h) == h \notin ReplicaOf(i) /\ <<i, h>> \in Copies

(* The newest of position i's two small-state slots (mutant newest_small_state: one key, latest
   write wins). *)
Newest(i) == IF small[i][0] >= small[i][1] THEN small[i][0] ELSE small[i][1]

(* The decision computed purely from the present reports of epoch e (and the small-state slots of
   the lost positions in the store).  The agreed frontier: the reports' F if they are equal; F+1
   if they stand at F and F+1 and every one at F entered the check of F+1 (atCheck): someone
   committed F+1, so every member finished it and wrote its small state of F+1 (SplitOnlyAtCheck),
   and those at F roll forward; else reject ("frontier").  For a Replace, every lost position's
   small state of the agreed F must be in its slot (else reject, "small_state"): a spare
   continues its stream from there.  A shrink does not read it: the lost position's stream ends
   with it (accelpact/membership/decide.py, which never asked for it there).  rewind: a survivor at the agreed F holds the step of F+1
   applied, which it discards (one rolled forward keeps its step: it commits it).  With Shrink and
   too few free spares: a shrink to the replica groups of world e whose members all reported,
   refused when there is none.  Mutant frontier_split: differing frontiers are not checked and
   nothing rolls forward (F is the smallest, every survivor keeps its own); newest_small_state:
   the slot is not checked (one latest-wins key: nobody compares its frontier with F);
   shrink_without_holder: not refused; shrink_keeps_broken_group: refused as it should, but every
   present position stays, the survivors of a broken group too. *)
Decision(e) ==
    LET WP == WorldPositions(e)
        P == Present(e)
        L == WP \ P
        free == FreeSpares(e)
        fs == {rep[e][i].f : i \in P}
        f0 == IF P = {} THEN 0 ELSE Min(fs)
        roll == /\ Mutant # "frontier_split"
                /\ fs = {f0, f0 + 1}
                /\ \A i \in P : rep[e][i].f = f0 => rep[e][i].atCheck
        okF == Cardinality(fs) <= 1 \/ roll \/ Mutant = "frontier_split"
        okSpare == Cardinality(free) >= Cardinality(L)
        f == IF roll THEN f0 + 1 ELSE f0
        okSmall == \/ \A i \in L : small[i][f % 2] = f
                   \/ Mutant = "newest_small_state"
        okReplica == \A i \in L : SourcesOf(e, i, f) # {}
        shrink == Shrink /\ ~okSpare
        whole == {G \in Groups : G \subseteq WP /\ G \subseteq P}
        stay == IF Mutant = "shrink_keeps_broken_group" /\ whole # {} THEN P ELSE UNION whole
        okGroup == stay # {} \/ Mutant = "shrink_without_holder"
    IN IF okF /\ okSmall /\ okSpare /\ okReplica
       THEN [kind |-> "replace", present |-> P, positions |-> WP,
             holder |-> [i \in Positions |-> IF i \in P THEN rep[e][i].proc
                                             ELSE IF i \in L THEN Nth(free, Cardinality({j \in L : j < i}))
                                             ELSE None],
             src |-> [i \in Positions |-> IF i \in P THEN None ELSE Min(SourcesOf(e, i, f))],
             f |-> f,
             rewind |-> \E i \in P : rep[e][i].applied /\ rep[e][i].f = f,
             why |-> "ok"]
       ELSE IF shrink /\ okF /\ okGroup
       THEN [kind |-> "shrink", present |-> P, positions |-> stay,
             holder |-> [i \in Positions |-> IF i \in stay THEN rep[e][i].proc ELSE None],
             src |-> [i \in Positions |-> None],
             f |-> f,
             rewind |-> \E i \in P : rep[e][i].applied /\ rep[e][i].f = f,
             why |-> "ok"]
       ELSE [NoDecision EXCEPT !.kind = "reject", !.present = P,
             !.why = IF ~okF THEN "frontier" ELSE IF ~okSmall THEN "small_state" ELSE IF shrink THEN "no_group"
                     ELSE IF ~okSpare THEN "no_spare" ELSE "no_replica"]

(* p was fenced: a register of a world p held a position in decided without that position (a
   Replace gave it to a spare; a shrink declared it lost). *)
Fenced(p) == \E e \in Epochs, i \in Positions :
                /\ <<i, p>> \in claims[e] /\ reg[e].kind \in {"replace", "shrink"} /\ i \notin reg[e].present
(* Decision d leaves position i: a shrink without i's replica group, i present (alive). *)
Leaves(d, i) == d.kind = "shrink" /\ i \in d.present /\ i \notin d.positions
(* p was told to leave: a register of a world p held a position in leaves it. *)
Left(p) == \E e \in Epochs, i \in Positions : <<i, p>> \in claims[e] /\ Leaves(reg[e], i)

(* The decision that formed p's world, as p read it. *)
Formed(p) == seen[p][world[p] - 1]
IsSpareIn(p) == pos[p] \notin Formed(p).present
Members(d) == {d.holder[i] : i \in d.positions}
(* What release=resume must find: the member joined, built the world, holds an intact state. *)
Ready(q, e) == world[q] = e /\ groups[q] = e /\ shard[q] >= 0

(* p has read a register that decided without its position: it knows it was replaced. *)
KnowsFenced(p) == \E e \in Epochs, i \in Positions :
                     /\ <<i, p>> \in claims[e] /\ seen[p][e].kind \in {"replace", "shrink"}
                     /\ i \notin seen[p][e].present

(* A train record by p (resuming after a release, or committing an update) with the groups of
   world `uses`: fill the ghosts.  A fenced process that has not read its fence yet may still
   resume into its world (it was slow to read the release while the world broke again): its
   first collective fails, it posts PRESENT and reads the fence.  What it must never do is
   commit an update, or train once it has read the fence.  A rank a shrink let go never trains
   after the register was written (it waits for it: no record between), and the average of every
   record divides by its world's size and replica count. *)
TrainRecord(p, uses, commit, knows) ==
    /\ zombie' = IF knows \/ (commit /\ Fenced(p)) THEN zombie \cup {p} ELSE zombie
    /\ stale' = IF \/ uses # world[p] \/ groups[p] # world[p]
                   \/ commit /\ \E x \in Epochs : x > world[p] /\ rel[x] = "resume"
                THEN stale \cup {p} ELSE stale
    /\ staleAvg' = IF avgOver[p] # Avg(world[p]) THEN staleAvg \cup {p} ELSE staleAvg
    /\ leftTrained' = IF Left(p) THEN leftTrained \cup {p} ELSE leftTrained

-----------------------------------------------------------------------------
Init ==
    /\ phase = [p \in Procs |-> IF p \in Positions THEN "Train" ELSE "Spare"]
    /\ pos = [p \in Procs |-> IF p \in Positions THEN p ELSE None]
    /\ world = [p \in Procs |-> IF p \in Positions THEN 0 ELSE None]
    /\ frontier = [p \in Procs |-> 0]
    /\ stepped = [p \in Procs |-> FALSE]
    /\ entered = [p \in Procs |-> FALSE]
    /\ shard = [p \in Procs |-> IF p \in Positions THEN ShardOf(p) ELSE NoShard]
    /\ groups = [p \in Procs |-> IF p \in Positions THEN 0 ELSE None]
    /\ refs = groups
    /\ vote = [p \in Procs |-> "none"]
    /\ rep = [e \in Epochs |-> [i \in Positions |-> NoReport]]
    /\ reg = [e \in Epochs |-> NoDecision]
    /\ rel = [e \in Epochs |-> IF e = 0 THEN "resume" ELSE "none"]
    /\ small = [i \in Positions |-> [k \in Slots |-> IF k = 0 THEN 0 ELSE None]]
    /\ losses = 0
    /\ seen = [p \in Procs |-> [e \in Epochs |-> NoDecision]]
    /\ relSeen = [p \in Procs |-> [e \in Epochs |-> "none"]]
    /\ claims = [e \in Epochs |-> IF e = 0 THEN {<<i, i>> : i \in Positions} ELSE {}]
    /\ notReady = [e \in Epochs |-> {}]
    /\ zombie = {}
    /\ stale = {}
    /\ resumedAt = [p \in Procs |-> IF p \in Positions THEN [w |-> 0, f |-> 0, stepped |-> FALSE]
                                    ELSE NotResumed]
    /\ held = [p \in Procs |-> None]
    /\ avgOver = [p \in Procs |-> IF p \in Positions THEN AvgOf(Positions) ELSE NoAvg]
    /\ staleAvg = {}
    /\ leftTrained = {}
    /\ sstate = [p \in Procs |-> None]

-----------------------------------------------------------------------------
(* Training, one synchronous update F+1 in two steps.  Enter: p finishes it (the body ran, the
   step is applied) and contributes a clean flag to its boundary check, an all-reduce over every
   member; before the contribution leaves, p's small state of F+1 is written to its position's
   slot of F+1's parity and acknowledged.  Only while every position of the world is held by a
   training process at p's frontier (nobody has committed F+1 before everyone entered).  With
   InFlight the members enter one at a time, from the highest position down (a loss may strike
   when some have entered and others not; one order keeps the interleavings few); without, the
   whole world finishes the update and enters at once (one step, taken by its highest position): a
   loss strikes before the update, inside its check (everyone entered, some may have committed) or
   after it. *)
Enter(p) ==
    /\ phase[p] = "Train" /\ ~entered[p] /\ frontier[p] < MaxFrontier
    /\ \A i \in WorldPositions(world[p]) : \E q \in Procs : <<i, q>> \in claims[world[p]] /\ world[q] = world[p]
                                             /\ phase[q] = "Train" /\ frontier[q] = frontier[p]
                                             /\ (InFlight /\ i > pos[p] => entered[q])
    /\ LET E == IF InFlight THEN {p} ELSE {q \in Procs : world[q] = world[p] /\ phase[q] = "Train"} IN
       /\ \A q \in E : pos[p] >= pos[q]
       /\ entered' = [q \in Procs |-> entered[q] \/ q \in E]
       /\ stepped' = [q \in Procs |-> stepped[q] \/ q \in E]
       /\ small' = [i \in Positions |-> IF \E q \in E : pos[q] = i
                                        THEN [small[i] EXCEPT ![(frontier[p] + 1) % 2] = frontier[p] + 1]
                                        ELSE small[i]]
    /\ UNCHANGED <<phase, pos, world, frontier, shard, groups, avgOver, refs, vote, rep, reg, rel, losses,
                   seen, relSeen, claims, notReady, zombie, stale, staleAvg, leftTrained, resumedAt, held,
                   sstate>>

(* Commit: the check's all-reduce completes on p, which needs every member's contribution: each
   has entered (or has committed already).  From the highest position down (a loss can strike
   between two commits, so survivors' frontiers may differ by one; one order keeps the
   interleavings few, and this one lets the position whose shard no replica shares -- position 2
   in MC3copies -- commit, and send its neighbour copy of the commit, while a peer still stands
   one behind: a roll forward can then take the copy), only while every position of the world
   trains.  Mutant commit_without_all: p commits without waiting for every member to have
   entered (a check that commits on a quorum or a timeout). *)
Commit(p) ==
    /\ phase[p] = "Train" /\ entered[p]
    /\ \A i \in WorldPositions(world[p]) : \E q \in Procs : <<i, q>> \in claims[world[p]] /\ world[q] = world[p]
                                             /\ phase[q] = "Train"
    /\ \A q \in Procs : world[q] = world[p] /\ phase[q] = "Train" =>
          /\ IF pos[q] > pos[p] THEN frontier[q] = frontier[p] + 1 ELSE frontier[q] = frontier[p]
          /\ entered[q] \/ frontier[q] = frontier[p] + 1 \/ Mutant = "commit_without_all"
    /\ frontier' = [frontier EXCEPT ![p] = @ + 1]
    /\ entered' = [entered EXCEPT ![p] = FALSE]
    /\ stepped' = [stepped EXCEPT ![p] = FALSE]
    /\ TrainRecord(p, refs[p], TRUE, KnowsFenced(p))
    /\ UNCHANGED <<phase, pos, world, shard, groups, avgOver, refs, vote, rep, reg, rel, small, losses,
                   seen, relSeen, claims, notReady, resumedAt, held, sstate>>

(* p's collective fails: it posts PRESENT for its world.  It reports its committed F either way;
   atCheck: it entered the check of F+1 and never learned its outcome (its step is applied).  Not
   entered, mid-update it may still have applied the step of F+1 (applied: InFlight). *)
PostPresent(p, applied) ==
    /\ rep' = [rep EXCEPT ![world[p]][pos[p]] = [proc |-> p, f |-> frontier[p],
                                                  applied |-> applied \/ entered[p],
                                                  atCheck |-> entered[p], held |-> held[p]]]
    /\ stepped' = [stepped EXCEPT ![p] = applied \/ entered[p]]
    /\ phase' = [phase EXCEPT ![p] = "Wait"]

(* An applied step of F+1 that p may report without having entered the check (InFlight). *)
MayApply(p, a) == a => InFlight /\ frontier[p] < MaxFrontier /\ ~entered[p]

Detect(p) ==
    /\ phase[p] = "Train" /\ Broken(world[p])
    /\ \E a \in BOOLEAN : MayApply(p, a) /\ PostPresent(p, a)
    /\ UNCHANGED <<pos, world, frontier, entered, shard, groups, avgOver, refs, vote, reg, rel, small, losses,
                   seen, relSeen, claims, notReady, zombie, stale, staleAvg, leftTrained, resumedAt, held,
                   sstate>>

(* p obeys decision d of its epoch: reject -> exit 75; its position not in the present set ->
   fenced, exit; else it joins world e+1 at its position at the agreed frontier: at d.f it restores
   its boundary snapshot (an update in flight is re-run by everyone); one behind (it entered the
   check of d.f: the decision rolled forward) it commits update d.f locally, its state being
   d.f's already (the body ran, the step is applied): no restore.  Either way at d.f, no step
   applied, out of any check; it continues its own small-state stream.  A shrink that keeps not
   p's replica group: p leaves (exits cleanly).  Mutant late_present_joins: a survivor that posted
   PRESENT too late to be in the present set joins anyway; leaver_trains: a leaving rank is not
   told, and goes on into the smaller world like one that stays; frontier_split: every survivor
   restores its own frontier. *)
Obey(p, d) ==
    LET e == world[p] IN
    /\ seen' = [seen EXCEPT ![p][e] = d]
    /\ IF d.kind = "reject"
       THEN /\ phase' = [phase EXCEPT ![p] = "Reject"]
            /\ UNCHANGED <<world, frontier, stepped, entered, claims, vote, held, sstate>>
       ELSE IF pos[p] \notin d.present /\ Mutant # "late_present_joins"
       THEN /\ phase' = [phase EXCEPT ![p] = "Exit"]
            /\ UNCHANGED <<world, frontier, stepped, entered, claims, vote, held, sstate>>
       ELSE IF Leaves(d, pos[p]) /\ Mutant # "leaver_trains"
       THEN /\ phase' = [phase EXCEPT ![p] = "Left"]
            /\ UNCHANGED <<world, frontier, stepped, entered, claims, vote, held, sstate>>
       ELSE /\ phase' = [phase EXCEPT ![p] = "Build"]
            /\ world' = [world EXCEPT ![p] = e + 1]
            /\ frontier' = [frontier EXCEPT ![p] = IF Mutant = "frontier_split" THEN @ ELSE d.f]
            /\ stepped' = [stepped EXCEPT ![p] = FALSE]
            /\ entered' = [entered EXCEPT ![p] = FALSE]
            /\ sstate' = [sstate EXCEPT ![p] = None]
            /\ vote' = [vote EXCEPT ![p] = "none"]
            /\ claims' = [claims EXCEPT ![e + 1] = @ \cup {<<pos[p], p>>}]

(* A present survivor's wait ends (all W present, or its deadline: any time) and it writes the
   register of its epoch, compare-and-set, first write wins; then it reads the register (its own
   value) and obeys it.  Mutant two_claim_one_position: the register is a plain value, last write
   wins, and every survivor acts on the decision it computed itself. *)
Decide(p) ==
    /\ phase[p] = "Wait"
    /\ reg[world[p]].kind = "none" \/ Mutant = "two_claim_one_position"
    /\ reg' = [reg EXCEPT ![world[p]] = Decision(world[p])]
    /\ Obey(p, Decision(world[p]))
    /\ UNCHANGED <<pos, shard, groups, avgOver, refs, rep, rel, small, losses, relSeen, notReady,
                   zombie, stale, staleAvg, leftTrained, resumedAt, held>>

(* p reads the register of its epoch, written by another, and obeys it. *)
Follow(p) ==
    /\ phase[p] = "Wait" /\ reg[world[p]].kind # "none"
    /\ Obey(p, reg[world[p]])
    /\ UNCHANGED <<pos, shard, groups, avgOver, refs, rep, reg, rel, small, losses, relSeen, notReady,
                   zombie, stale, staleAvg, leftTrained, resumedAt, held>>

(* A spare reads a register that assigns it a lost position: it joins world e+1 holding it, and
   takes the lost rank's small state (RNG, data cursor, schedulers) from the position's slot of the
   agreed frontier's parity, to continue its stream from there (Vote checks its frontier).  Mutant
   newest_small_state: one key per position, latest write wins: the spare takes the newest. *)
Activate(s) ==
    /\ phase[s] = "Spare"
    /\ \E e \in Epochs, i \in Positions :
          /\ reg[e].kind = "replace" /\ i \notin reg[e].present /\ reg[e].holder[i] = s
          /\ phase' = [phase EXCEPT ![s] = "Build"]
          /\ vote' = [vote EXCEPT ![s] = "none"]
          /\ pos' = [pos EXCEPT ![s] = i]
          /\ world' = [world EXCEPT ![s] = e + 1]
          /\ seen' = [seen EXCEPT ![s][e] = reg[e]]
          /\ claims' = [claims EXCEPT ![e + 1] = @ \cup {<<i, s>>}]
          /\ sstate' = [sstate EXCEPT ![s] = IF Mutant = "newest_small_state" THEN Newest(i)
                                              ELSE small[i][reg[e].f % 2]]
    /\ UNCHANGED <<frontier, stepped, entered, shard, groups, avgOver, refs, rep, reg, rel, small, losses, relSeen,
                   notReady, zombie, stale, staleAvg, leftTrained, resumedAt, held>>

(* Build world e's groups (default, data, control) on a fresh prefix: a rendezvous of every
   member the decision names, so it completes only once each has joined and is alive.  The old
   world is retired for p (its groups are destroyed).  A survivor then validates and votes ok
   at once (one step: nothing observable happens in between); a spare votes once its state has
   arrived (Vote).  Its gradient average now divides by the new world's size and replica count.
   Mutant stale_average: a survivor keeps the average of the world it came from. *)
Build(p) ==
    /\ phase[p] = "Build" /\ groups[p] # world[p] /\ rel[world[p]] = "none"
    /\ \A q \in Members(Formed(p)) : world[q] = world[p] /\ phase[q] \in {"Build", "Voted"}
    /\ groups' = [groups EXCEPT ![p] = world[p]]
    /\ avgOver' = [avgOver EXCEPT ![p] = IF Mutant = "stale_average" /\ ~IsSpareIn(p) THEN @
                                          ELSE Avg(world[p])]
    /\ IF IsSpareIn(p) THEN UNCHANGED <<phase, vote, held>>
       ELSE /\ phase' = [phase EXCEPT ![p] = "Voted"]
            /\ vote' = [vote EXCEPT ![p] = "ok"]
    /\ UNCHANGED <<pos, world, frontier, stepped, entered, shard, refs, rep, reg, rel, small, losses,
                   seen, relSeen, claims, notReady, zombie, stale, staleAvg, leftTrained, resumedAt, held,
                   sstate>>

(* The source of lost position i sends its state (at F: it restored its snapshot of F, or
   committed F as it joined: roll forward), or the neighbour copy of i it holds, with a digest
   to the spare, over world e's groups; the bytes may arrive corrupted. *)
Transfer(p) ==
    /\ phase[p] \in {"Build", "Voted"} /\ groups[p] = world[p]
    /\ \E i \in Formed(p).positions \ Formed(p).present :
          LET q == Formed(p).holder[i] IN
          /\ Formed(p).src[i] = pos[p]
          /\ phase[q] = "Build" /\ world[q] = world[p] /\ groups[q] = world[p] /\ shard[q] = NoShard
          /\ \E ok \in BOOLEAN :
                /\ ok \/ Corruption
                /\ shard' = [shard EXCEPT ![q] = IF ~ok THEN Corrupt
                                                 ELSE IF ViaCopy(i, pos[p]) THEN ShardOf(i) ELSE shard[p]]
          \* a neighbour copy carries the lost rank's state of the update it was taken at
          /\ frontier' = [frontier EXCEPT ![q] = IF ViaCopy(i, pos[p]) THEN held[p] ELSE frontier[p]]
          /\ stepped' = [stepped EXCEPT ![q] = IF ViaCopy(i, pos[p]) THEN FALSE ELSE stepped[p]]
    /\ UNCHANGED <<phase, pos, world, entered, groups, avgOver, refs, vote, rep, reg, rel, small, losses, seen,
                   relSeen, claims, notReady, zombie, stale, staleAvg, leftTrained, resumedAt, held, sstate>>

(* The spare validates: groups built, state arrived, digest checked, and the small state it took
   is of the decision's frontier (a slot of another frontier fails the join); it votes.  Mutant
   newest_small_state: nobody compares the small state's frontier with the decision's. *)
Vote(p) ==
    /\ phase[p] = "Build" /\ groups[p] = world[p] /\ rel[world[p]] = "none"
    /\ IsSpareIn(p) /\ shard[p] # NoShard
    /\ LET okSmall == sstate[p] = Formed(p).f \/ Mutant = "newest_small_state" IN
       vote' = [vote EXCEPT ![p] = IF shard[p] = Corrupt \/ ~okSmall THEN "fail" ELSE "ok"]
    /\ phase' = [phase EXCEPT ![p] = "Voted"]
    /\ UNCHANGED <<pos, world, frontier, stepped, entered, shard, groups, avgOver, refs, rep, reg, rel, small,
                   losses, seen, relSeen, claims, notReady, zombie, stale, staleAvg, leftTrained, resumedAt,
                   held, sstate>>

(* A member writes release=resume once every member named by the decision voted ok in this
   world.  Mutant release_before_transfer_verified: the survivors' votes only. *)
ReleaseResume(p) ==
    /\ phase[p] \in {"Build", "Voted"} /\ rel[world[p]] = "none"
    /\ LET e == world[p]
           d == Formed(p)
           voters == IF Mutant = "release_before_transfer_verified"
                     THEN {d.holder[i] : i \in d.present} ELSE Members(d)
       IN /\ \A q \in voters : world[q] = e /\ vote[q] = "ok"
          /\ rel' = [rel EXCEPT ![e] = "resume"]
          /\ notReady' = [notReady EXCEPT ![e] = {q \in Members(d) : ~Ready(q, e)}]
    /\ UNCHANGED <<procVars, rep, reg, small, losses, seen, relSeen, claims, zombie, stale, staleAvg, leftTrained,
                   resumedAt>>

(* A failed vote or an expired deadline: compare-and-set release=reject.  The deadline expires
   when a member can no longer come (crashed) or, with Spurious, at any time.  Mutant
   blind_release: a plain write that overwrites resume. *)
ReleaseReject(p) ==
    /\ phase[p] \in {"Build", "Voted"}
    /\ \/ Spurious
       \/ \E q \in Members(Formed(p)) : vote[q] = "fail" \/ phase[q] \in {"Dead", "Exit", "Reject"}
    /\ \/ rel[world[p]] = "none"
       \/ Mutant = "blind_release" /\ rel[world[p]] = "resume"
    /\ rel' = [rel EXCEPT ![world[p]] = "reject"]
    /\ UNCHANGED <<procVars, rep, reg, small, losses, seen, relSeen, claims, notReady, zombie, stale, staleAvg,
                   leftTrained, resumedAt>>

(* release=resume read: train in world e at F, with the groups just built (the "train" record).
   Mutant train_on_old_world: the training loop keeps the references it had. *)
Resume(p) ==
    /\ phase[p] = "Voted" /\ rel[world[p]] = "resume"
    /\ LET uses == IF Mutant = "train_on_old_world" THEN refs[p] ELSE groups[p] IN
       /\ refs' = [refs EXCEPT ![p] = uses]
       /\ TrainRecord(p, uses, FALSE, KnowsFenced(p))
    /\ phase' = [phase EXCEPT ![p] = "Train"]
    /\ relSeen' = [relSeen EXCEPT ![p][world[p]] = "resume"]
    /\ resumedAt' = [resumedAt EXCEPT ![p] = [w |-> world[p], f |-> frontier[p], stepped |-> stepped[p]]]
    /\ UNCHANGED <<pos, world, frontier, stepped, entered, shard, groups, avgOver, vote, rep, reg, rel, small,
                   losses, seen, claims, notReady, held, sstate>>

Abort(p) ==
    /\ phase[p] \in {"Build", "Voted"} /\ rel[world[p]] = "reject"
    /\ phase' = [phase EXCEPT ![p] = "Reject"]
    /\ relSeen' = [relSeen EXCEPT ![p][world[p]] = "reject"]
    /\ UNCHANGED <<pos, world, frontier, stepped, entered, shard, groups, avgOver, refs, vote, rep, reg, rel,
                   small, losses, seen, claims, notReady, zombie, stale, staleAvg, leftTrained, resumedAt, held,
                   sstate>>

(* Neighbour replication (issue 16): after a commit, p's state at its frontier reaches the
   memory of the process holding p's copy position in p's world, asynchronously: a loss may
   strike before it arrives, and the holder then keeps the copy of an earlier update (or none). *)
Replicate(p) ==
    /\ phase[p] = "Train"
    /\ \E h \in Positions, q \in Procs :
          /\ <<pos[p], h>> \in Copies /\ <<h, q>> \in claims[world[p]] /\ world[q] = world[p]
          /\ phase[q] = "Train" /\ held[q] # frontier[p]
          /\ held' = [held EXCEPT ![q] = frontier[p]]
    /\ UNCHANGED <<phase, pos, world, frontier, stepped, entered, shard, groups, avgOver, refs, vote, rep, reg,
                   rel, small, losses, seen, relSeen, claims, notReady, zombie, stale, staleAvg, leftTrained,
                   resumedAt, sstate>>

-----------------------------------------------------------------------------
(* Faults *)

(* A process crashes, at any point (a spare too). *)
Crash(p) ==
    /\ losses < MaxLosses /\ phase[p] \notin {"Dead", "Exit", "Reject", "Cut", "Left"}
    /\ phase' = [phase EXCEPT ![p] = "Dead"]
    /\ losses' = losses + 1
    /\ UNCHANGED <<pos, world, frontier, stepped, entered, shard, groups, avgOver, refs, vote, rep, reg, rel,
                   small, seen, relSeen, claims, notReady, zombie, stale, staleAvg, leftTrained, resumedAt, held,
                   sstate>>

(* A training process is partitioned: alive, reaching neither its peers nor the store. *)
Partition(p) ==
    /\ losses < MaxLosses /\ phase[p] = "Train"
    /\ phase' = [phase EXCEPT ![p] = "Cut"]
    /\ losses' = losses + 1
    /\ UNCHANGED <<pos, world, frontier, stepped, entered, shard, groups, avgOver, refs, vote, rep, reg, rel,
                   small, seen, relSeen, claims, notReady, zombie, stale, staleAvg, leftTrained, resumedAt, held,
                   sstate>>

(* The partitioned process reaches the store again.  Register of its epoch still empty: the
   partition was transient, it posts PRESENT like any survivor.  Written: it reads it, learns it
   was replaced (or that the change rejected) and exits.  Mutant partition_not_fenced: it goes
   on training in its world.  Mutant two_claim_one_position: decisions are local, so it posts
   PRESENT without reading the register. *)
Heal(p) ==
    /\ phase[p] = "Cut"
    /\ LET e == world[p] IN
       IF reg[e].kind = "none" \/ Mutant = "two_claim_one_position"
       THEN /\ \E a \in BOOLEAN : MayApply(p, a) /\ PostPresent(p, a)
            /\ UNCHANGED <<seen, zombie, stale, staleAvg, leftTrained, held>>
       ELSE /\ seen' = [seen EXCEPT ![p][e] = reg[e]]
            /\ UNCHANGED <<rep, stepped, held>>
            /\ IF Mutant = "partition_not_fenced"
               THEN /\ phase' = [phase EXCEPT ![p] = "Train"]
                    /\ TrainRecord(p, refs[p], FALSE,
                                   reg[e].kind # "reject" /\ pos[p] \notin reg[e].present)
               ELSE /\ phase' = [phase EXCEPT ![p] = IF reg[e].kind = "reject" THEN "Reject" ELSE "Exit"]
                    /\ UNCHANGED <<zombie, stale, staleAvg, leftTrained, held>>
    /\ UNCHANGED <<pos, world, frontier, entered, shard, groups, avgOver, refs, vote, reg, rel, small, losses,
                   relSeen, claims, notReady, resumedAt, held, sstate>>

(* Legitimate ends: nothing in a recovery any more.  Stuttering there is not a deadlock. *)
Done ==
    /\ \A p \in Procs : phase[p] \in {"Train", "Spare", "Dead", "Exit", "Reject", "Left"}
    /\ UNCHANGED vars

Next ==
    \/ \E p \in Procs :
          \/ Enter(p) \/ Commit(p) \/ Detect(p) \/ Decide(p) \/ Follow(p) \/ Activate(p) \/ Build(p)
          \/ Transfer(p) \/ Vote(p) \/ ReleaseResume(p) \/ ReleaseReject(p) \/ Resume(p)
          \/ Abort(p) \/ Crash(p) \/ Partition(p) \/ Heal(p) \/ Replicate(p)
    \/ Done

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
(* Properties *)

Decisions == [kind : {"none", "replace", "shrink", "reject"}, present : SUBSET Positions,
              positions : SUBSET Positions,
              holder : [Positions -> Procs \cup {None}], src : [Positions -> Positions \cup {None}],
              f : Frontiers, rewind : BOOLEAN,
              why : {"none", "ok", "frontier", "small_state", "no_spare", "no_replica", "no_group"}]

TypeOK ==
    /\ phase \in [Procs -> Phases]
    /\ pos \in [Procs -> Positions \cup {None}]
    /\ world \in [Procs -> Epochs \cup {None}]
    /\ frontier \in [Procs -> Frontiers]
    /\ stepped \in [Procs -> BOOLEAN]
    /\ entered \in [Procs -> BOOLEAN]
    /\ shard \in [Procs -> {ShardOf(i) : i \in Positions} \cup {NoShard, Corrupt}]
    /\ groups \in [Procs -> Epochs \cup {None}] /\ refs \in [Procs -> Epochs \cup {None}]
    /\ vote \in [Procs -> {"none", "ok", "fail"}]
    /\ rep \in [Epochs -> [Positions -> [proc : Procs \cup {None}, f : Frontiers, applied : BOOLEAN,
                                          atCheck : BOOLEAN, held : Frontiers \cup {None}]]]
    /\ reg \in [Epochs -> Decisions]
    /\ rel \in [Epochs -> {"none", "resume", "reject"}]
    /\ small \in [Positions -> [Slots -> Frontiers \cup {None}]]
    /\ losses \in 0 .. MaxLosses
    /\ seen \in [Procs -> [Epochs -> Decisions]]
    /\ relSeen \in [Procs -> [Epochs -> {"none", "resume", "reject"}]]
    /\ claims \in [Epochs -> SUBSET (Positions \X Procs)]
    /\ notReady \in [Epochs -> SUBSET Procs]
    /\ zombie \subseteq Procs /\ stale \subseteq Procs
    /\ resumedAt \in [Procs -> [w : Epochs \cup {None}, f : Frontiers, stepped : BOOLEAN]]
    /\ held \in [Procs -> Frontiers \cup {None}]
    /\ avgOver \in [Procs -> {AvgOf(X) : X \in SUBSET Positions}]
    /\ staleAvg \subseteq Procs /\ leftTrained \subseteq Procs
    /\ sstate \in [Procs -> Frontiers \cup {None}]

(* release=resume of a world was written only when every member the decision names had joined,
   built the world's groups and held an intact, verified state (the spare's transfer checked).
   Excludes releasing on the survivors' votes (release_before_transfer_verified). *)
SpareValidatedBeforeRelease ==
    \A e \in Epochs : rel[e] = "resume" => notReady[e] = {}

(* Every process holding a position holds that position's shard: a spare's state came from a
   member of the lost position's replica set, or from the neighbour copy of that position.
   Excludes a source outside them (transfer_from_non_replica).  That a copy is of the agreed
   frontier is NoSplitFrontier's business (stale_neighbour_copy). *)
StateFromReplica ==
    \A p \in Procs : pos[p] # None /\ shard[p] >= 0 => shard[p] = ShardOf(pos[p])

(* A fenced (replaced) process never commits an update, and never writes a train record once it
   has read the register that fenced it.  (It may resume into its world before it reads it: a
   member slow to read release=resume while the world breaks again -- witness
   fenced_member_resumes; its first collective fails and it reads the fence.)  Excludes a
   partitioned rank that goes on training after reaching the store (partition_not_fenced). *)
FencedNeverTrains == zombie = {}

(* No two processes ever claim one position of one world; a released world has every position
   held.  Excludes a late survivor that joins although the register left it out, beside the
   spare that took its position (late_present_joins). *)
OnePositionOneProcess ==
    \A e \in Epochs :
        /\ \A i \in Positions : Cardinality({q \in Procs : <<i, q>> \in claims[e]}) <= 1
        /\ rel[e] = "resume" => \A i \in WorldPositions(e) : \E q \in Procs : <<i, q>> \in claims[e]

(* No process acts on another value of a membership or release register than a peer did.
   Excludes a last-write-wins register on which each survivor writes and follows its own
   decision (two_claim_one_position) and a release timeout that overwrites resume
   (blind_release). *)
OutcomeAgreement ==
    \A p, q \in Procs, e \in Epochs :
        /\ seen[p][e].kind # "none" /\ seen[q][e].kind # "none" => seen[p][e] = seen[q][e]
        /\ relSeen[p][e] # "none" /\ relSeen[q][e] # "none" => relSeen[p][e] = relSeen[q][e]

(* A spare is claimed by one membership change at most: no two registers name it.  Excludes a
   pool that forgets earlier claims and hands a spare that already holds a position to a second
   loss (spare_claimed_twice: it never comes, and the new world never forms); only a second loss
   can show it, so MC3 has two. *)
SpareClaimedOnce ==
    \A e1, e2 \in Epochs : e1 # e2 => Assigned(reg[e1]) \cap Assigned(reg[e2]) = {}

(* Processes that trained after the release of the same world hold the same state: frontier and
   no half-applied step.  Excludes a decision that ignores differing frontiers and does not roll
   forward (frontier_split: survivors resume each at its own F).  A decision that takes a
   neighbour copy of another update than the survivors' frontier (stale_neighbour_copy: the lost
   rank committed, its copy of that commit never arrived) breaks it too, but the spare that
   resumes with that copy breaks SpareContinuesLostStream first (its small state is of the agreed
   F, its state of the copy's; the cfgs list SpareContinuesLostStream before this one).  Where frontier_split breaks it, SplitOnlyAtCheck fails in the same
   state (two members of the new world apart, neither in a check): the cfgs list it after. *)
NoSplitFrontier ==
    \A p, q \in Procs : resumedAt[p].w # None /\ resumedAt[p].w = resumedAt[q].w =>
        resumedAt[p].f = resumedAt[q].f /\ resumedAt[p].stepped = resumedAt[q].stepped

(* A process trains only with the groups of the world it belongs to, and never in a world after
   a newer one was released.  Excludes a training loop that keeps the retired world's groups
   (train_on_old_world). *)
NoTrainOnRetiredWorld == stale = {}

(* A shrink is decided only when every shard keeps a live holder: each shard coordinate is held
   by a present position the shrink keeps.  Excludes a shrink with no whole replica group left
   (shrink_without_holder: the refusal is missing, a shard would have no holder). *)
ShrinkKeepsEveryShard ==
    \A e \in Epochs : reg[e].kind = "shrink" =>
        \A c \in ShardIds : \E i \in reg[e].positions \cap reg[e].present : ShardOf(i) = c

(* A shrink keeps whole replica groups only: with every kept position, all of its group (so every
   kept replica is a whole copy of the model, and the replica count is a number of copies).
   Excludes keeping the survivors of a broken group (shrink_keeps_broken_group). *)
ShrinkKeepsWholeGroups ==
    \A e \in Epochs : reg[e].kind = "shrink" =>
        \A i \in reg[e].positions : GroupOf(i) \subseteq reg[e].positions

(* A rank a shrink let go (alive, its replica group broken) never writes a train record once the
   register that let it go was written: it leaves.  Excludes a leaving rank that is not told and
   goes on into the smaller world (leaver_trains). *)
LeaverNeverTrains == leftTrained = {}

(* Every train record's gradient average divides by the world size and the replica count of the
   world it trains in.  Excludes a rank that keeps the size of the world it came from after a
   shrink (stale_average: the classic gradient scaled by W/W'). *)
NoStaleAverage == staleAvg = {}

(* A spare that took over a lost position and resumed training in the world it joined applied the
   lost rank's small state (RNG, data cursor, schedulers) of exactly the frontier it resumed at:
   it continues the lost rank's stream, neither replaying nor skipping an update's data.  Excludes
   one latest-wins key per position read without comparing its frontier with the decision's
   (newest_small_state: the lost rank entered the check of F+1 and wrote F+1, nobody committed
   F+1, the agreed F is F, the spare takes F+1's); and a decision that takes a neighbour copy of
   another update than the agreed F (stale_neighbour_copy: the spare's state is the copy's, its
   small state the agreed F's; it breaks NoSplitFrontier too, once a survivor resumes beside it:
   the cfgs list this one first). *)
SpareContinuesLostStream ==
    \A p \in Procs : sstate[p] # None /\ resumedAt[p].w = world[p] => sstate[p] = resumedAt[p].f

(* p trained in the world it belongs to (world 0's members from the start, a member of a later
   world once it resumed there), as opposed to a member of a new world still joining it. *)
TrainedIn(p) == world[p] # None /\ resumedAt[p].w = world[p]
(* p reported, in PRESENT for its world, that it had entered the check and not learned it. *)
ReportedAtCheck(p) == rep[world[p]][pos[p]].proc = p /\ rep[world[p]][pos[p]].atCheck

(* The lemma that makes roll forward sound: two processes that trained in one world stand at most
   one update apart, and when one has committed an update the other has not, the other has
   entered that update's check (entered, or its PRESENT says atCheck): it finished the update,
   its step is applied, and its small state of it is in the store.  So a decision that sees F and
   F+1 may take F+1, the lost rank's small state of F+1 included.  Excludes a check that commits
   without every member's contribution (commit_without_all: a quorum or a timeout). *)
SplitOnlyAtCheck ==
    \A p, q \in Procs :
        frontier[p] > frontier[q] /\ world[p] = world[q] /\ TrainedIn(p) /\ TrainedIn(q) =>
            /\ frontier[p] = frontier[q] + 1
            /\ entered[q] \/ ReportedAtCheck(q)

-----------------------------------------------------------------------------
(* Witnesses: interesting states, negated, that TLC must reach (spec/witnesses/membership_NAME.cfg). *)

(* A replacement reaches resume and the spare trains. *)
NoReplacementEver == ~ \E s \in Spares : phase[s] = "Train" /\ resumedAt[s].w # None
(* Two membership changes each replaced a position by a spare (S >= 2). *)
NeverTwoReplacements ==
    ~ \E s, t \in Spares : /\ s # t /\ resumedAt[s].w # None /\ resumedAt[t].w # None
                           /\ resumedAt[s].w # resumedAt[t].w
(* A position no replica shares is lost, and a spare trains in its place with the state of the
   neighbour copy (CopyStride > 0). *)
NoNeighbourReplacement ==
    ~ \E s \in Spares : /\ phase[s] = "Train" /\ resumedAt[s].w # None /\ pos[s] # None
                       /\ ReplicaOf(pos[s]) = {pos[s]}
(* A partitioned rank reaches the store, learns it was replaced, exits; its spare trains. *)
NeverFencedExit ==
    ~ \E p \in Positions, s \in Spares : phase[p] = "Exit" /\ phase[s] = "Train" /\ pos[s] = pos[p]
(* A member of the new world is lost before release, and the release rejects. *)
NeverLossBeforeReleaseRejects ==
    ~ \E e \in Epochs : e > 0 /\ rel[e] = "reject" /\ \E q \in Procs : world[q] = e /\ phase[q] = "Dead"
(* A fenced member resumes into its world before reading the fence (it was slow to read
   release=resume while the world broke again): why FencedNeverTrains is about commits and about
   what a process does after it has read its fence. *)
NeverFencedMemberResumes ==
    ~ \E p \in Procs : Fenced(p) /\ phase[p] = "Train" /\ world[p] > 0 /\ resumedAt[p].w = world[p]
(* A shrink goes on with fewer replicas and a kept rank commits an update in the smaller world
   (Shrink; ShrinkKeepsEveryShard, ShrinkKeepsWholeGroups and NoStaleAverage talk about it). *)
NeverShrinkTrains ==
    ~ \E p \in Procs : /\ phase[p] = "Train" /\ world[p] > 0 /\ reg[world[p] - 1].kind = "shrink"
                       /\ frontier[p] > reg[world[p] - 1].f /\ avgOver[p].size < W
(* A rank of the broken replica group leaves while the kept ranks train in the smaller world
   (LeaverNeverTrains talks about it). *)
NeverLeaverLeaves ==
    ~ \E p, q \in Procs : /\ phase[p] = "Left" /\ phase[q] = "Train" /\ world[q] = world[p] + 1
                          /\ resumedAt[q].w = world[q]
(* No replica group is whole after a loss: the shrink is refused (a shard would have no holder). *)
NeverShrinkRefused == ~ \E e \in Epochs : reg[e].why = "no_group"
(* A loss inside the boundary check of an update: some survivors committed it, the others
   entered its check; the decision rolled forward (a present report stands below the agreed F)
   and a spare trains in the new world with the lost rank's small state of that F
   (SplitOnlyAtCheck and SpareContinuesLostStream talk about it). *)
NeverSplitRolledForward ==
    ~ \E s \in Spares : /\ phase[s] = "Train" /\ world[s] # None /\ world[s] > 0 /\ resumedAt[s].w = world[s]
                       /\ \E i \in reg[world[s] - 1].present : rep[world[s] - 1][i].f < reg[world[s] - 1].f

=============================================================================
