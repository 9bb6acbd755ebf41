/*
 * The lease protocol of mongolock-async, for SPIN: a lock's document and the writes the store sends
 * to it (mongolock_async/store/mutex.py), and the processes that send them (waiting.py, queues.py,
 * lease.py, keeper.py, watcher.py, lock.py), on a server clock that can step back and forward.
 *
 * Read docs/model.md first: what is modelled, the time model, the faults, the properties and the
 * switches (MUT_*) that turn each property's control on. model/actions.md maps every write the store
 * can send to the action here that models it; tests/unit/test_model.py checks that table against the
 * store, and against the ACTION comments in this file.
 *
 * The same processes also drive a document of permits (MODEL_KIND): a semaphore's
 * (mongolock_async/_core/semaphore.py; the document's writes in store/permits.py and
 * store/permit_release.py) or an election's (_core/election.py: a semaphore of one permit, served in
 * turn, always renewed). The client is the lock's code for every kind (AsyncMongoLock._init with
 * Permits), except that a document of permits' queue records no followers (queues.LocalQueue's
 * `followers`, False for them: waiting.wait_for_lease).
 *
 * Time: rt counts ticks of real time (every process's monotonic clock); srv is the server's clock
 * (S0 + rt, moved by clock steps). Everything that is due happens before time moves on: the tick is
 * enabled only when no mandatory step is (URGENT), so a process that is neither paused nor killed
 * acts at once, and a request is applied in the tick it is sent unless a fault holds it. Choices
 * (when a task starts, when a holder releases) and faults (budgeted) can happen at any step.
 *
 * A TTL is T ticks, the safety margin M: a lease taken by a request sent at tick s is believed
 * until s + T - M (lease.local_deadline) and expires on the server T after it was applied.
 */

/* ---- bounds -------------------------------------------------------------------------------- */
#ifndef NP
#define NP 3            /* processes */
#endif
#ifndef NT
#define NT 2            /* tasks per process */
#endif
#define NW (NP*NT)
/* What one run explores, read from the environment when the verifier starts (model/check.py sets
 * it): MODEL_<NAME>=<value>. One compiled verifier serves every configuration and control. */
c_decl {
	int model_setting(const char *name, int otherwise) {
		char key[64];
		const char *value;
		snprintf(key, sizeof key, "MODEL_%s", name);
		value = getenv(key);
		return value ? atoi(value) : otherwise;
	}
	/* MODEL_<NAME>=a,b,c...: the index-th of a list (the last one repeats; otherwise without it) */
	int model_list(const char *name, int index, int otherwise) {
		char key[64];
		const char *value;
		int at = 0, last = otherwise;
		snprintf(key, sizeof key, "MODEL_%s", name);
		value = getenv(key);
		while (value && *value) {
			last = atoi(value);
			if (at == index) return last;
			value = strchr(value, ',');
			if (value) value++;
			at++;
		}
		return last;
	}
}
hidden byte H;          /* the horizon: ticks of real time explored */
hidden byte ACQS;       /* acquisitions per task */
hidden byte START_BY;   /* a task's first acquire starts before this tick */
hidden byte FAIR;       /* fair=True handles */
hidden byte HB;         /* heartbeat=True handles */
hidden byte STREAK;     /* waiting.LOCAL_STREAK (8 in the code) */
hidden byte TTO[NW];    /* each task's acquire: its timeout in ticks; TO_TRY: blocking=False; TO_NONE: none */
hidden byte TASKS[NP];  /* tasks per process that acquire (at most NT) */
#define TO_TRY 0
#define TO_NONE 255
hidden byte MUT;        /* the control in force (MUT_*), or 0: the protocol as it is */
hidden byte MUT2;       /* a second mutation in force with it (a control whose trace needs two old rules), or 0 */
hidden byte KIND;       /* the document's kind: a lock's (0), a semaphore's or an election's (documents of permits) */
hidden byte LIMIT;      /* a document of permits' limit (the request's and the stored one: handles agree on it) */
hidden byte RESIGN_TO;  /* an election's leader may resign to a named candidate (AsyncMongoElection.resign(to=...)) */
#define KIND_LOCK 0
#define KIND_SEMAPHORE 1    /* AsyncMongoSemaphore: Permits("semaphore", limit), permits of weight 1 */
#define KIND_ELECTION 2     /* AsyncMongoElection: Permits("election", 1), fair, the heartbeat always on */
#define PERMITS (KIND != KIND_LOCK)

/* the controls: each a mutation the checker must refute */
#define MUT_NO_WITHDRAWAL 1     /* a waiter that gives up withdraws nothing */
#define MUT_NO_WITHDRAWN 2      /* a withdrawal does not remember the tokens it withdrew */
#define MUT_CLAIM_WITHDRAWN 3   /* an attempt of a withdrawn token still claims a lease handed to it */
#define MUT_HAND_TO_ANY_PLACE 4 /* a release hands the lease to a place without checking it is live */
#define MUT_FENCE_CLOCK_ONLY 5  /* a fencing token is the server's clock alone (no + 1) */
#define MUT_NO_FENCE_CHECK 6    /* a hand-off seen on the stream is taken as fresh without its fence */
#define MUT_FORGET_RELEASES 7   /* a release sent again does not match recentReleases */
#define MUT_RENEW_EXPIRED 8     /* a renewal revives an expired lease */
#define MUT_LOOK_PER_HEAD 9     /* when to look again belongs to the first waiter, not the place */
#define MUT_RELEASED_NOT_DONE 10 /* a token whose lease was released is not done with (before issue 36) */
#define MUT_DEADLINE_FROM_REPLY 12 /* a holder's local deadline counts from the reply, not the request */
#define MUT_TAKE_LIVE 13        /* an acquire takes the lock without testing the lease is not live */
#define MUT_FOLLOWER_FORGOTTEN 14 /* a lone waiter's attempt names no follower, though its place may record one (before issue 36) */
#define MUT_LEAVE_NO_UPSERT 11  /* a withdrawal of a name with no document writes nothing (before issue 36) */
#define MUT_OVERSLEEP 15        /* a placed waiter sleeps past the horizon (until its timeout) instead of looking again at the lease's expiry: only news wakes it */
#define MUT_REFRESH_FAILED_GONE 16 /* a place refresh that failed in transit is taken as gone (before issue 40) */
#define MUT_ATTEMPT_PER_WAITER 17 /* a first waiter's attempt is bounded by its own timeout, waiters behind it or not (before issue 40) */
#define MUT_FOLLOWER_REQUEUED 18 /* a follower that is done with still joins the queue (before issue 40's store fix) */
#define MUT_PERMIT_NO_ROOM 19   /* a permit is taken without testing that the live holders leave room for it */
#define MUT_PERMIT_DOC_FENCE 20 /* a hand-off event naming several permits is taken with the document's fence */
#define MUT_LEADER_UNTIL_TOLD 21 /* a holder (a leader) believes until a renewal is refused, not until its local deadline */
#define MUTATED(m) (MUT == (m) || MUT2 == (m))

#define T 3             /* a TTL */
#define M 1             /* the safety margin */
#define FRESH M         /* Waiter.fresh_for: the handle's safety margin */
#define SLACK 1         /* waiting.GIVE_UP_SLACK */
#define HOLDT 2         /* how long a held request waits at the server */
#define DB 1            /* the largest backward step of the server's clock */
#define S0 8            /* the server's clock at rt = 0 */
#define KF 8            /* fencing tokens' floor: the server's clock times KF (the code: microseconds) */
#define PURGE_AFTER (T+1)  /* the idle cleanup index's expireAfterSeconds */
#define TPP 10          /* owner tokens per process: process p's are p*TPP+1 .. p*TPP+TPP */
#define QN 4            /* places in the stored queue */
#define RR 4            /* recentReleases kept (mutex.LOCK_RELEASES_REMEMBERED is 16) */
#define NR 8            /* requests in flight, all processes */
#define EV 3            /* change events buffered per process */
#define NWD 2           /* withdrawals in flight per process */
#define NH 3            /* holders a document of permits lists (the largest LIMIT explored is 2; one more for a
                         * control that takes past the limit) */
#define NONE 255


/* ---- the lock's document (mutex.py) ------------------------------------------------------- */
bit  d_ex;              /* the document exists */
byte d_own;             /* owner (0: null) */
byte d_exp;             /* expiresAt */
byte d_fence;           /* fence */
byte d_rel;             /* releasedOwner */
byte rr_o[RR];          /* recentReleases: o ... */
byte rr_u[RR];          /* ... and until */
byte q_t[QN];           /* queue: t */
byte q_at[QN];          /* at */
byte q_exp[QN];         /* exp */
byte q_n[QN];           /* n (the follower's token, 0: none) */
byte q_len;
int  d_wd;              /* withdrawn (a set of tokens, as bits) */
/* a document of permits (store/permits.py): owner stays 0; expiresAt (d_exp) is its latest permit's
 * expiry; fence (d_fence) the one counter; rr_o the releasedOwners (rr_u unused); d_wd withdrawn;
 * the queue as a lock's, its places of weight 1 and without followers */
byte ph_o[NH];           /* holders: o ... */
byte ph_exp[NH];         /* ... exp */
byte ph_fen[NH];         /* ... fence */
byte ph_len;

/* ---- time ---------------------------------------------------------------------------------- */
byte rt;
byte srv = S0;
#define LIVE (d_ex && d_own != 0 && d_exp > srv)
#define PLIVE(i) (i < ph_len && ph_exp[i] > srv)
#define ANY_PLIVE (PLIVE(0) || PLIVE(1) || PLIVE(2))

/* ---- requests in flight ------------------------------------------------------------------------ */
#define K_ACQ 1         /* LockStore.try_acquire: mutex.acquire_pipeline */
#define K_REL 2         /* LockStore.release: mutex.release_pipeline */
#define K_LEAVE 3       /* LockStore.leave: mutex.release_pipeline(leaving=...) */
#define K_RENEW 4       /* LockStore.renew: mutex._renewal */
#define K_REFRESH 5     /* LockStore.refresh_places: expressions._refresh_place */
#define K_PUTFIRST 6    /* LockStore.put_candidate_first: permits.put_first_pipeline (an election's resign(to=...)) */
#define R_PEND 1
#define R_OK 2
#define R_ERR 3
/* who awaits a request */
#define BY_TASK(w) (w)
#define BY_RENEW(w) (16+(w))
#define BY_KEEPER(p) (32+(p))
#define BY_WD(p,s) (48+(p)*NWD+(s))

byte rq_k[NR];          /* kind (0: a free slot) */
byte rq_p[NR];          /* the process that sent it */
byte rq_by[NR];         /* who awaits its reply (NONE: nobody, its caller gave up) */
byte rq_tok[NR];        /* its owner token (or first withdrawn token) */
byte rq_a[NR];          /* follower / successor / second withdrawn token */
byte rq_b[NR];          /* enqueue / the successor's follower */
bit  rq_c[NR];          /* successor_first */
byte rq_st[NR];
bit  rq_lose[NR];        /* its reply will be lost */
bit  rq_slow[NR];       /* its reply will be delayed (rq_ready) */
byte rq_hold[NR];       /* not applied before this tick */
byte rq_ready[NR];      /* applied, its reply not back before this tick (a reply delayed on its way back) */
byte rq_bound[NR];      /* its caller's bound: RequestTimeout from this tick */
byte rq_r1[NR];         /* the reply */
byte rq_r2[NR];
byte rq_r3[NR];

/* ---- processes ----------------------------------------------------------------------------- */
bit  alive[NP];
byte pz[NP];            /* paused until this tick */
byte ntk[NP];           /* tokens made */
/* a process's steps: while it is neither killed nor paused, and no request sent waits to be
 * applied (a request reaches the server at once unless a fault holds it) */
#define RUNS(p) (alive[p] && pz[p] <= rt && !SERVER_URGENT)

/* the local queue (queues.LocalQueue) of each process, for the one name */
bit  lq_on[NP];         /* registered (someone waits) */
byte lq_n[NP];          /* waiters */
byte lq_w[NW];          /* lq_w[p*NT + k]: the k-th waiter's task */
byte lq_slot[NP];       /* slot */
byte lq_pl[NP];         /* place */
byte lq_pw[NP];         /* place_written_at */
byte lq_pf[NP];         /* place_fence */
byte lq_pfol[NP];       /* place_follower */
byte lq_up[NP];         /* upcoming */
byte lq_rif[NP];        /* releases_in_flight */
byte lq_look[NP];       /* look_at */
byte lq_streak[NP];     /* local_streak */
byte lq_gen[NP];        /* which LocalQueue object this is (a release in flight keeps its own) */
#define ABSENT 0
#define STORED 1
#define UNCERTAIN 2
#define HEAD(p) (lq_n[p] > 0 -> lq_w[(p)*NT] : NONE)

/* the change stream (watcher.ReleaseWatcher) */
byte st[NP];            /* 0: not running, 1: open, 2: failing (waiters poll) */
byte stu[NP];           /* failing until */
bit  stw[NP];           /* opened: every head looks again (_wake_all) */
byte ev_k[NP*EV];       /* buffered events: kind (0: none) */
byte ev_t[NP*EV];       /* token handed to */
byte ev_f[NP*EV];       /* fence */
byte ev_at[NP*EV];      /* deliverable from this tick */
#define E_RELEASED 1
#define E_HANDED 2
#define E_DELETED 3
#define STREAMING(p) (st[p] == 1)

/* the heartbeat's places (keeper.LeaseKeeper._places) */
bit  kp_on[NP];
byte kp_due[NP];
byte kp_req[NP];
byte kp_slot[NP];
byte kp_sent[NP];
byte kp_gen[NP];

/* withdrawals (waiting.withdraw), in the background */
#define WD_FREE 0
#define WD_SEND 1
#define WD_FLIGHT 2
#define WD_BACK 3
#define WD_DONE 4
byte wd_s[NP*NWD];
byte wd_t1[NP*NWD];
byte wd_t2[NP*NWD];
byte wd_until[NP*NWD];
byte wd_at[NP*NWD];
byte wd_req[NP*NWD];
byte wd_by[NP*NWD];     /* the task that awaits it (NONE: nobody) */

/* ---- tasks --------------------------------------------------------------------------------- */
#define TS_IDLE 0
#define TS_WAIT 1       /* waiting.wait_for_lease */
#define TS_LEAVE 2      /* its finally: awaiting the withdrawal (finish_soon) */
#define TS_HOLD 3       /* holds a lease (the body of async with) */
#define TS_REL 4        /* waiting.hand_over: a release in flight */
#define TS_RELB 5       /* ... backing off before sending it again */
#define TS_RELW 6       /* ... withdrawing a hand-off nobody takes (_HandedToNobody) */
#define TS_TRY 7        /* a non-blocking acquire's request in flight */
#define TS_DONE 8
/* Turn */
#define QUEUED 0
#define DUE 1
#define ATTEMPTING 2
#define PLACED 3
#define BACKOFF 4
#define GRANTED 5
/* what a task does once hand_over returns */
#define THEN_FINISH 0   /* the acquisition is over */
#define THEN_REWAIT 1   /* acquire waits again (the grant came too late to hold) */
#define THEN_LEAVE 2    /* wait_for_lease's finally (a grant handed on as its caller was cancelled) */

byte ts[NW];
byte tu[NW];            /* turn */
byte tgu[NW];           /* give_up_at */
byte tat[NW];           /* attempt_at (BACKING_OFF), or the release's next try */
byte tacq[NW];          /* acquisitions left */
bit  tses[NW];          /* in_session */
bit  tatt[NW];          /* attempted */
bit  tcan[NW];          /* cancelled while awaiting a request */
byte treq[NW];          /* the request it awaits */
byte tptok[NW];         /* the attempt's place token ... */
byte tpfol[NW];         /* ... its follower */
byte tsent[NW];         /* ... when it was sent */
bit  tcov[NW];          /* ... covered by the stream when sent */
bit  twses[NW];         /* ... sent in a session */
bit  tline[NW];         /* ... belongs to the line: the task may stop waiting for it (waiting._line_attempt) */
bit  tputf[NW];         /* a leader's put_first in flight (treq), before its resignation */
byte gtok[NW];          /* the grant */
byte gfen[NW];
byte gsent[NW];
byte ltok[NW];          /* the lease */
byte lfen[NW];
byte ldl[NW];           /* its local deadline */
bit  lforced[NW];       /* broken by release --force */
byte lren[NW];          /* the heartbeat's renewal in flight */
byte lrdue[NW];
byte lrsent[NW];
byte rtok[NW];          /* the release in flight: its owner ... */
byte rsucc[NW];         /* ... successor */
byte rsfol[NW];         /* ... the successor's follower */
byte rgen[NW];          /* ... the LocalQueue it named the successor from (NONE: none) */
byte rqslot[NW];        /* ... that queue's slot when it was unregistered (its waiters all gone) */
byte rfirst[NW];        /* ... when its first copy was sent */
byte runtil[NW];        /* ... sent again until this tick */
byte tthen[NW];         /* ... and what follows it */
byte twd[NW];           /* the withdrawal it awaits */
byte twdend[NW];        /* ... until this tick at most */

/* ---- faults left --------------------------------------------------------------------------- */
byte f_hold, f_lost, f_cancel, f_pause, f_kill, f_step, f_event, f_stream, f_force, f_purge, f_slow;

/* ---- what the properties track ------------------------------------------------------------- */
byte fence_seen;        /* the largest fencing token a holder was given */
byte forced_tok;        /* the owner token whose lease an operator broke last */
byte gh_since = NONE;   /* a live lease nobody believes in: since when (rt) ... */
byte gh_tok;            /* ... its owner and fence */
byte gh_fen;
byte gh_back;           /* ... backward clock steps since */
byte fr_since = NONE;   /* the lock free while someone waits: since when (rt) */
byte fr_quiet;          /* P4 is judged only from this tick on (after a fault that may delay) */
/* documents of permits */
byte fence_top;         /* the largest fencing token the server issued (a permit's), across cleanups */
int  p_forced;          /* the owner tokens whose permits an operator broke (bits) */
byte pg_tok[NH];        /* P3 per permit: a live permit nobody believes in (its owner, fence) ... */
byte pg_fen[NH];
byte pg_since[NH];      /* ... since when (rt; NONE: a free tracker) */
byte pg_back[NH];       /* ... backward clock steps since */
/* P8: a holder's release in flight (rheld), and whether a copy of it ended its live lease (rdone) */
bit  rheld[NW];
bit  rdone[NW];

/* temporaries (not part of the state) */
hidden byte tq_t[QN+1], tq_at[QN+1], tq_exp[QN+1], tq_n[QN+1];
hidden byte tq_len, i_, j_, k_, x_, y_, z_, h_t, h_at, h_n, v_, u_;
hidden byte b_, c_, e_, f_;
hidden byte w_, g_, bd_, own_, h_exp;
hidden byte ln_req, ln_tok, ln_fol, ln_sent;   /* line_leaves: the line's attempt handed on */
hidden byte ln_cov, ln_ses, ln_was;
hidden byte tp_o[NH+QN+1], tp_exp[NH+QN+1], tp_fen[NH+QN+1];   /* a document of permits' holders, as a write builds them */
hidden byte tp_len, hd_len, hd_room, hd_next, hd_i;
hidden byte hd_t[QN+1], hd_at[QN+1], hd_exp[QN+1];             /* ... the places a release hands permits to */

/* ================================================================================================
 * The store's writes, each atomic on the server. ACTION comments name the store entry point and
 * the document fields the pipeline writes (checked against model/actions.md by tests/unit/test_model.py).
 * ============================================================================================== */

/* expressions._live_places: the queue's unexpired places, without the tokens a and b (0: none) */
inline live_places(a, b)
{
	tq_len = 0; i_ = 0;
	do
	:: i_ < q_len ->
		if
		:: (q_exp[i_] > srv || MUTATED(MUT_HAND_TO_ANY_PLACE)) && q_t[i_] != a && q_t[i_] != b ->
			tq_t[tq_len] = q_t[i_]; tq_at[tq_len] = q_at[i_]; tq_exp[tq_len] = q_exp[i_]; tq_n[tq_len] = q_n[i_];
			tq_len++
		:: else
		fi;
		i_++
	:: else -> break
	od
}

/* tq without token a */
inline tq_without(a)
{
	j_ = 0; i_ = 0;
	do
	:: i_ < tq_len ->
		if
		:: a == 0 || tq_t[i_] != a ->
			tq_t[j_] = tq_t[i_]; tq_at[j_] = tq_at[i_]; tq_exp[j_] = tq_exp[i_]; tq_n[j_] = tq_n[i_]; j_++
		:: else
		fi;
		i_++
	:: else -> break
	od;
	tq_len = j_
}

/* expressions._with_place: token a's place (written now, follower b) rewritten where it stands (its
 * at not moved back), or queued last */
inline tq_with_place(a, b)
{
	i_ = 0;
	do
	:: i_ < tq_len && tq_t[i_] != a -> i_++
	:: else -> break
	od;
	if
	:: i_ < tq_len -> tq_at[i_] = (tq_at[i_] > srv -> tq_at[i_] : srv); tq_exp[i_] = srv + T; tq_n[i_] = b
	:: else ->
		assert(tq_len < QN);
		tq_t[tq_len] = a; tq_at[tq_len] = srv; tq_exp[tq_len] = srv + T; tq_n[tq_len] = b; tq_len++
	fi
}

/* append a place */
inline tq_append(a, at, b)
{
	assert(tq_len < QN);
	tq_t[tq_len] = a; tq_at[tq_len] = at; tq_exp[tq_len] = srv + T; tq_n[tq_len] = b; tq_len++
}

inline tq_store()
{
	i_ = 0;
	do
	:: i_ < tq_len -> q_t[i_] = tq_t[i_]; q_at[i_] = tq_at[i_]; q_exp[i_] = tq_exp[i_]; q_n[i_] = tq_n[i_]; i_++
	:: i_ >= tq_len && i_ < QN -> q_t[i_] = 0; q_at[i_] = 0; q_exp[i_] = 0; q_n[i_] = 0; i_++
	:: else -> break
	od;
	q_len = tq_len
}

/* expressions._NEXT_FENCE: max(fence + 1, the server's clock in microseconds) */
inline next_fence()
{
	if
	:: MUTATED(MUT_FENCE_CLOCK_ONLY) -> d_fence = srv * KF
	:: else -> d_fence = (d_fence + 1 > srv * KF -> d_fence + 1 : srv * KF)
	fi
}

#define WITHDRAWN(t) ((d_wd >> (t)) & 1)

/* expressions._done_with: token t was withdrawn, or held a lease the document remembers releasing
 * (releasedOwner, recentReleases.o): its process never sends it again; in dw_ */
hidden byte dw_, sc_;
inline done_with(t)
{
	dw_ = WITHDRAWN(t);
	if
	:: !MUTATED(MUT_RELEASED_NOT_DONE) ->
		dw_ = dw_ || (t != 0 && d_rel == t);
		i_ = 0;
		do
		:: i_ < RR -> dw_ = dw_ || (t != 0 && rr_o[i_] == t); i_++
		:: else -> break
		od
	:: else
	fi
}

/* a change event to process p's stream (watcher: the server-side filter lets through hand-offs to
 * p's places, deletions, and owners cleared by a forced release; not a release that clears the
 * owner: it had no live place to hand to) */
inline event(p, kind, tok, fen)
{
	if
	:: alive[p] && st[p] == 1 ->
		k_ = 0;
		do
		:: k_ < EV && ev_k[(p)*EV + k_] != 0 -> k_++
		:: else -> break
		od;
		assert(k_ < EV);
		ev_k[(p)*EV + k_] = kind; ev_t[(p)*EV + k_] = tok; ev_f[(p)*EV + k_] = fen; ev_at[(p)*EV + k_] = rt
	:: else
	fi
}

inline event_all(kind)
{
	v_ = 0;
	do
	:: v_ < NP -> event(v_, kind, 0, 0); v_++
	:: else -> break
	od
}

/* P8's record: a holder's release of token t ended its live lease */
inline released_by(t)
{
	w_ = 0;
	do
	:: w_ < NW -> if
		:: rheld[w_] && rtok[w_] == (t) -> rdone[w_] = 1
		:: else
		fi; w_++
	:: else -> break
	od
}

/* ACTION acquire: LockStore.try_acquire (mutex.acquire_pipeline), an upserting findAndModify.
 * WRITES owner expiresAt fence ttlMs holder acquiredAt renewedAt queue
 * Takes the lock if it is free or expired (fair: and no live place is ahead), claims a lease handed
 * to the token, else (enqueue) stores or refreshes the token's place; a withdrawn token does neither,
 * and a follower that is done with does not join the queue. */
inline srv_acquire(r)
{
	x_ = rq_tok[r]; y_ = rq_a[r];
	d_ex = 1;
	done_with(x_);                                                       /* _gone */
	live_places(0, 0);
	/* _ahead: live places ahead of ours, all of them if we have none (fair only) */
	k_ = 0;
	do
	:: k_ < tq_len && tq_t[k_] != x_ -> k_++
	:: else -> break
	od;
	b_ = LIVE;
	c_ = (b_ && d_own == x_ && !dw_);                                    /* _claim */
	c_ = (c_ || MUTATED(MUT_CLAIM_WITHDRAWN) && b_ && d_own == x_);
	e_ = ((!b_ || MUTATED(MUT_TAKE_LIVE)) && (!FAIR || k_ == 0) && !dw_); /* _take */
	if
	:: c_ || e_ ->
		d_own = x_; d_exp = srv + T;
		if
		:: e_ -> next_fence()
		:: else
		fi;
		tq_without(x_);
		/* the follower joins, unless it is done with (a late request naming a withdrawn follower) */
		if
		:: y_ != 0 -> tq_without(y_); done_with(y_);
			if
			:: !dw_ || MUTATED(MUT_FOLLOWER_REQUEUED) -> tq_append(y_, srv, 0)
			:: else
			fi
		:: else
		fi;
		tq_store()
	:: else ->
		if
		:: dw_ -> tq_store()
		:: !dw_ && rq_b[r] -> tq_with_place(x_, y_); tq_store()
		:: else                                                          /* queue as it was */
		fi
	fi;
	/* the reply: the document after the write */
	rq_r1[r] = (d_own == x_); rq_r2[r] = d_fence; rq_r3[r] = NONE;
	/* waiting._until_next_change: from the place's at, the next expiry that can let it in */
	k_ = 0;
	do
	:: k_ < q_len && q_t[k_] != x_ -> k_++
	:: else -> break
	od;
	if
	:: k_ < q_len && !rq_r1[r] ->
		z_ = NONE;
		if
		:: d_own != 0 && d_exp > q_at[k_] -> z_ = d_exp - q_at[k_]
		:: else
		fi;
		j_ = 0;
		do
		:: FAIR && j_ < k_ ->
			if
			:: q_exp[j_] > q_at[k_] && q_exp[j_] - q_at[k_] < z_ -> z_ = q_exp[j_] - q_at[k_]
			:: else
			fi;
			j_++
		:: else -> break
		od;
		rq_r3[r] = z_
	:: else
	fi
}

/* hand the lease from owner u_ to the place (h_t, h_at, h_n) or, with h_t 0, to nobody, as
 * release_pipeline's own branch does; a remote hand-off writes handedOffTo */
inline hand_on(remote)
{
	if
	:: h_t != 0 ->
		d_own = h_t; d_exp = (h_at > srv -> h_at : srv) + T;
		next_fence();
		if
		:: remote -> event((h_t - 1) / TPP, E_HANDED, h_t, d_fence)   /* handedOffTo */
		:: else
		fi;
		/* the handee leaves the queue; its follower joins it last, unless it is done with */
		tq_without(h_t);
		if
		:: h_n != 0 -> tq_without(h_n); done_with(h_n);
			if
			:: !dw_ || MUTATED(MUT_FOLLOWER_REQUEUED) -> u_ = (h_at > srv -> h_at : srv); tq_append(h_n, u_, 0)
			:: else
			fi
		:: else
		fi
	:: else ->
		d_own = 0; d_exp = srv   /* no event: nobody had a live place (store/streams.py) */
	fi;
	d_rel = own_
}

/* ACTION release: LockStore.release (mutex.release_pipeline), a findAndModify matching the owner, its
 * releasedOwner or its recentReleases.
 * WRITES owner expiresAt fence ttlMs holder acquiredAt renewedAt handedOffAt handedOffTo releasedAt releasedOwner recentReleases queue
 * Ends the owner's live lease and hands it, in the same write, to the successor (a waiting task of
 * the releasing process) or the oldest place; a copy sent again matches its own record. */
inline srv_release(r)
{
	x_ = rq_tok[r];
	b_ = 0;
	k_ = 0;
	do
	:: k_ < RR -> if
		:: rr_o[k_] == x_ -> b_ = 1
		:: else
		fi; k_++
	:: else -> break
	od;
	b_ = (b_ && !MUTATED(MUT_FORGET_RELEASES));
	if
	:: !d_ex || (d_own != x_ && d_rel != x_ && !b_) -> rq_r1[r] = 0       /* nothing matched: None */
	:: else ->
		live_places(x_, 0);
		c_ = (LIVE && d_own == x_);                                           /* _own */
		/* a successor done with (withdrawn, or its lease released) is neither handed the lease nor
		 * queued: sc_, the successor in play (0: none) */
		sc_ = rq_a[r];
		if
		:: sc_ != 0 -> done_with(sc_);
			if
			:: dw_ -> tq_without(sc_); sc_ = 0
			:: else
			fi
		:: else
		fi;
		/* _c: the candidates, the successor rewritten where it stands or queued last */
		if
		:: sc_ != 0 && c_ -> tq_with_place(sc_, rq_b[r])
		:: else
		fi;
		h_t = 0; h_at = 0; h_n = 0;
		if
		:: c_ ->
			if
			:: sc_ == 0 || FAIR || !rq_c[r] ->
				/* the oldest place (fair: of all; else of the other processes' first) */
				k_ = 0;
				do
				:: k_ < tq_len && !FAIR && sc_ != 0 && tq_t[k_] == sc_ -> k_++
				:: else -> break
				od;
				if
				:: k_ < tq_len -> h_t = tq_t[k_]; h_at = tq_at[k_]; h_n = tq_n[k_]; h_exp = tq_exp[k_]
				:: else
				fi
			:: else
			fi;
			if
			:: h_t == 0 && sc_ != 0 -> h_t = sc_; h_at = srv; h_n = rq_b[r]; h_exp = srv + T   /* the successor's new place */
			:: else
			fi;
			/* recentReleases: those still resendable, and this one */
			j_ = 0; i_ = 0;
			do
			:: i_ < RR ->
				if
				:: rr_o[i_] != 0 && rr_u[i_] > srv -> rr_o[j_] = rr_o[i_]; rr_u[j_] = rr_u[i_]; j_++
				:: else
				fi; i_++
			:: else -> break
			od;
			if
			:: j_ == RR -> i_ = 1; do
				:: i_ < RR -> rr_o[i_-1] = rr_o[i_]; rr_u[i_-1] = rr_u[i_]; i_++
				:: else -> break
				od; j_ = RR - 1
			:: else
			fi;
			rr_o[j_] = d_own; rr_u[j_] = d_exp; j_++;
			do
			:: j_ < RR -> rr_o[j_] = 0; rr_u[j_] = 0; j_++
			:: else -> break
			od;
			own_ = d_own;
			c_code { check_handee(h_t, h_exp); };
			released_by(own_);
			hand_on(h_t != rq_a[r])
		:: else
		fi;
		tq_store();
		rq_r1[r] = 1; rq_r2[r] = d_own; rq_r3[r] = d_fence
	fi
}

/* ACTION withdraw: LockStore.leave (mutex.release_pipeline with leaving), an update of the document.
 * WRITES owner expiresAt fence ttlMs holder acquiredAt renewedAt handedOffAt handedOffTo releasedAt releasedOwner withdrawn queue
 * Removes the places of the tokens, passes on a lease handed to one of them meanwhile, and
 * remembers the tokens as withdrawn. */
inline srv_leave(r)
{
	if
	:: d_ex || !MUTATED(MUT_LEAVE_NO_UPSERT) ->
		d_ex = 1;                                 /* an upsert: the attempt it withdraws may create it later */
		live_places(rq_tok[r], rq_a[r]);
		c_ = (LIVE && (d_own == rq_tok[r] || d_own == rq_a[r]));
		if
		:: c_ ->
			h_t = 0; h_at = 0; h_n = 0;
			if
			:: tq_len > 0 -> h_t = tq_t[0]; h_at = tq_at[0]; h_n = tq_n[0]
			:: else
			fi;
			own_ = d_own;
			hand_on(1)
		:: else
		fi;
		tq_store();
		if
		:: !MUTATED(MUT_NO_WITHDRAWN) ->
			d_wd = d_wd | (1 << rq_tok[r]);
			if
			:: rq_a[r] != 0 -> d_wd = d_wd | (1 << rq_a[r])
			:: else
			fi
		:: else
		fi
	:: else
	fi
}

/* ACTION renew: LockStore.renew (mutex._renewal, one statement of the batch), matching name and owner.
 * WRITES expiresAt ttlMs renewedAt renewal
 * A new expiry a TTL from now for a live lease; else nothing. */
inline srv_renew(r)
{
	if
	:: d_ex && d_own == rq_tok[r] && d_exp > srv -> d_exp = srv + T; rq_r1[r] = 1
	:: MUTATED(MUT_RENEW_EXPIRED) && d_ex && d_own == rq_tok[r] && d_exp <= srv -> d_exp = srv + T; rq_r1[r] = 1
	:: else -> rq_r1[r] = 0
	fi
}

/* ACTION refresh_place: LockStore.refresh_places (expressions._refresh_place), matching queue.t.
 * WRITES queue
 * Pushes the place's expiry a TTL on (its at not moved back). */
inline srv_refresh(r)
{
	rq_r1[r] = 0;
	if
	:: d_ex ->
		k_ = 0;
		do
		:: k_ < q_len && q_t[k_] != rq_tok[r] -> k_++
		:: else -> break
		od;
		if
		:: k_ < q_len -> q_exp[k_] = srv + T; q_at[k_] = (q_at[k_] > srv -> q_at[k_] : srv); rq_r1[r] = 1
		:: else
		fi
	:: else
	fi
}

/* ACTION force_release: LockStore.force_release (reports.force_release_lease, mutex.force_release_pipeline).
 * WRITES forcedRelease owner expiresAt releasedAt fence queue
 * The operator's break-glass: breaks the live lease (its holder still believes until its deadline). */
inline srv_force()
{
	w_ = 0;
	do
	:: w_ < NW -> if
		:: ts[w_] == TS_HOLD && ltok[w_] == d_own -> lforced[w_] = 1
		:: else
		fi; w_++
	:: else -> break
	od;
	forced_tok = d_own;
	d_own = 0; d_exp = srv;
	event_all(E_RELEASED)
}

/* the idle cleanup index (LockStore.ensure_idle_cleanup_index): deletes a document idle long enough */
inline srv_purge()
{
	d_ex = 0; d_own = 0; d_exp = 0; d_fence = 0; d_rel = 0; d_wd = 0;
	tq_len = 0; tq_store(); tp_len = 0; holders_store(); d_exp = 0;
	i_ = 0;
	do
	:: i_ < RR -> rr_o[i_] = 0; rr_u[i_] = 0; i_++
	:: else -> break
	od;
	event_all(E_DELETED)
}

/* ================================================================================================
 * A document of permits (store/permits.py, store/permit_release.py): a semaphore's or an election's.
 * Every permit weighs 1 (a read-write lock's writer, weighing the whole limit, is not modelled).
 * ============================================================================================== */

#define TOKEN_PROCESS(t) (((t) - 1) / TPP)
#define FORCED(t) (PERMITS -> ((p_forced >> (t)) & 1) : (t) == forced_tok)

/* permits.LIVE_HOLDERS: the holders whose permits have not expired, into tp */
inline live_holders()
{
	tp_len = 0; i_ = 0;
	do
	:: i_ < ph_len ->
		if
		:: ph_exp[i_] > srv -> tp_o[tp_len] = ph_o[i_]; tp_exp[tp_len] = ph_exp[i_]; tp_fen[tp_len] = ph_fen[i_]; tp_len++
		:: else
		fi;
		i_++
	:: else -> break
	od
}

/* holders = tp; expiresAt = permits.latest_expiry: the latest permit's expiry, or now */
inline holders_store()
{
	assert(tp_len <= NH);
	d_exp = srv; i_ = 0;
	do
	:: i_ < tp_len ->
		ph_o[i_] = tp_o[i_]; ph_exp[i_] = tp_exp[i_]; ph_fen[i_] = tp_fen[i_];
		d_exp = (tp_exp[i_] > d_exp -> tp_exp[i_] : d_exp); i_++
	:: i_ >= tp_len && i_ < NH -> ph_o[i_] = 0; ph_exp[i_] = 0; ph_fen[i_] = 0; i_++
	:: else -> break
	od;
	ph_len = tp_len
}

/* where token t is among the holders: in j_ (ph_len: not there) */
inline holder_index(t)
{
	j_ = 0;
	do
	:: j_ < ph_len && ph_o[j_] != (t) -> j_++
	:: else -> break
	od
}

/* P2 (promise 5, "each permit's above every token handed out before it", semaphore.py): a fencing token
 * the server issues with a permit is above every one it issued before, across cleanups */
inline issue_fence(f)
{
	if
	:: (f) <= fence_top -> c_code { uerror("P2 fencing: a permit's fencing token not above every one issued before it"); }
	:: else
	fi;
	fence_top = (f)
}

#define RELEASED_DUE(p, e) (ev_k[(p)*EV + e] == E_RELEASED && ev_at[(p)*EV + e] <= rt)
/* the freed event (permit_release: `freed`, a new value the change stream passes to every process);
 * one already buffered and due for a process stands for both (on_news is the same wake-up) */
inline freed_event_all()
{
	v_ = 0;
	do
	:: v_ < NP ->
		if
		:: (RELEASED_DUE(v_, 0) || RELEASED_DUE(v_, 1) || RELEASED_DUE(v_, 2)) -> skip
		:: else -> event(v_, E_RELEASED, 0, 0)
		fi;
		v_++
	:: else -> break
	od
}

/* ACTION permit_acquire: LockStore.try_acquire with permits (permits.acquire_pipeline), an upserting findAndModify.
 * WRITES kind limit fence holders queue expiresAt
 * Drops the expired holders; claims a permit the token holds (one handed to its place), or takes one
 * when the live holders leave room under the limit (fair: and no live place is ahead), with the next
 * fence; else (enqueue) stores or refreshes the token's place. A token done with (withdrawn, or in
 * releasedOwners) takes, claims and queues nothing. */
inline psrv_acquire(r)
{
	x_ = rq_tok[r];
	d_ex = 1;
	done_with(x_);                                        /* _gone */
	live_places(0, 0);                                    /* _queue */
	k_ = 0;
	do
	:: k_ < tq_len && tq_t[k_] != x_ -> k_++
	:: else -> break
	od;                                                   /* _ahead (fair only): k_ */
	live_holders();                                       /* _live_holders */
	j_ = 0;
	do
	:: j_ < tp_len && tp_o[j_] != x_ -> j_++
	:: else -> break
	od;                                                   /* _mine: j_ < tp_len */
	c_ = (j_ < tp_len && (!dw_ || MUTATED(MUT_CLAIM_WITHDRAWN)));                                   /* _claim */
	e_ = (j_ == tp_len && !dw_ && (tp_len + 1 <= LIMIT || MUTATED(MUT_PERMIT_NO_ROOM)) && (!FAIR || k_ == 0)); /* _take */
	if
	:: c_ -> tp_exp[j_] = srv + T                          /* renewed_mine */
	:: e_ -> next_fence(); issue_fence(d_fence);
		tp_o[tp_len] = x_; tp_exp[tp_len] = srv + T; tp_fen[tp_len] = d_fence; tp_len++
	:: else
	fi;
	holders_store();
	if
	:: c_ || e_ -> tq_without(x_); tq_store()
	:: else ->
		if
		:: dw_ -> tq_store()
		:: !dw_ && rq_b[r] -> tq_with_place(x_, 0); tq_store()
		:: else                                           /* queue as it was (blocking=False) */
		fi
	fi;
	/* the reply: whether the token holds a permit (LockState.holds), its fence (fence_of), and
	 * waiting._until_next_change: from the place's at, the next permit's expiry (fair: or a place's
	 * ahead) */
	holder_index(x_);
	rq_r1[r] = (j_ < ph_len); rq_r2[r] = (j_ < ph_len -> ph_fen[j_] : d_fence); rq_r3[r] = NONE;
	k_ = 0;
	do
	:: k_ < q_len && q_t[k_] != x_ -> k_++
	:: else -> break
	od;
	if
	:: k_ < q_len && !rq_r1[r] ->
		z_ = NONE; i_ = 0;
		do
		:: i_ < ph_len ->
			if
			:: ph_exp[i_] > q_at[k_] && ph_exp[i_] - q_at[k_] < z_ -> z_ = ph_exp[i_] - q_at[k_]
			:: else
			fi;
			i_++
		:: else -> break
		od;
		j_ = 0;
		do
		:: FAIR && j_ < k_ ->
			if
			:: q_exp[j_] > q_at[k_] && q_exp[j_] - q_at[k_] < z_ -> z_ = q_exp[j_] - q_at[k_]
			:: else
			fi;
			j_++
		:: else -> break
		od;
		rq_r3[r] = z_
	:: else
	fi
}

hidden byte hd_own, hd_sc;
/* permit_release._release_stages: a release (leaving 0: of the owner rq_tok, naming the successor rq_a,
 * successor_first rq_c) or a withdrawal (leaving 1: of the places of rq_tok and rq_a). The freed
 * weight goes, in the same write, to the oldest candidates that fit in the room the other live
 * holders leave under the limit, each a permit with its own fence (handedOffTo names them); or,
 * handed to nobody, `freed` wakes every process's waiters. */
inline permits_release(r, leaving)
{
	x_ = (leaving -> 0 : rq_tok[r]);
	live_holders();
	/* _own, and _rest: the live holders without the released (withdrawn) tokens' permits */
	hd_own = 0; j_ = 0; i_ = 0;
	do
	:: i_ < tp_len ->
		if
		:: leaving && (tp_o[i_] == rq_tok[r] || rq_a[r] != 0 && tp_o[i_] == rq_a[r]) || !leaving && tp_o[i_] == x_ ->
			hd_own = 1
		:: else -> tp_o[j_] = tp_o[i_]; tp_exp[j_] = tp_exp[i_]; tp_fen[j_] = tp_fen[i_]; j_++
		fi;
		i_++
	:: else -> break
	od;
	tp_len = j_;
	/* _queue: the live places without the releaser's (a withdrawal: without the withdrawn ones) */
	if
	:: leaving -> live_places(rq_tok[r], rq_a[r])
	:: else -> live_places(x_, 0)
	fi;
	if
	:: !hd_own -> tq_store()                              /* released nothing: holders as they were */
	:: else ->
		if
		:: !leaving -> released_by(x_)
		:: else
		fi;
		/* _candidates: the successor rewritten where it stands or queued last; without the tokens
		 * that hold a permit, released one or were withdrawn (_held) */
		hd_sc = (leaving -> 0 : rq_a[r]);
		if
		:: hd_sc != 0 -> tq_with_place(hd_sc, 0)
		:: else
		fi;
		j_ = 0; i_ = 0;
		do
		:: i_ < tq_len ->
			f_ = WITHDRAWN(tq_t[i_]);
			k_ = 0;
			do
			:: k_ < tp_len -> f_ = (f_ || tp_o[k_] == tq_t[i_]); k_++
			:: else -> break
			od;
			k_ = 0;
			do
			:: k_ < RR && !MUTATED(MUT_RELEASED_NOT_DONE) -> f_ = (f_ || rr_o[k_] == tq_t[i_]); k_++
			:: else -> break
			od;
			if
			:: !f_ -> tq_t[j_] = tq_t[i_]; tq_at[j_] = tq_at[i_]; tq_exp[j_] = tq_exp[i_]; tq_n[j_] = tq_n[i_]; j_++
			:: else
			fi;
			i_++
		:: else -> break
		od;
		tq_len = j_;
		/* _hand_off_order and _handoff: as many as fit in the room (weights of 1), from the first of the
		 * order, which moves the successor first (successor_first) or last, unless served in turn */
		k_ = 0;
		do
		:: hd_sc != 0 && k_ < tq_len && tq_t[k_] != hd_sc -> k_++
		:: else -> break
		od;
		if
		:: hd_sc == 0 -> k_ = tq_len
		:: else
		fi;
		hd_room = (LIMIT > tp_len -> LIMIT - tp_len : 0);
		hd_len = 0;
		if
		:: k_ < tq_len && !FAIR && rq_c[r] && hd_room > 0 ->
			hd_t[0] = tq_t[k_]; hd_at[0] = tq_at[k_]; hd_exp[0] = tq_exp[k_]; hd_len = 1
		:: else
		fi;
		i_ = 0;
		do
		:: i_ < tq_len && hd_len < hd_room ->
			if
			:: i_ != k_ || FAIR -> hd_t[hd_len] = tq_t[i_]; hd_at[hd_len] = tq_at[i_]; hd_exp[hd_len] = tq_exp[i_]; hd_len++
			:: else
			fi;
			i_++
		:: else -> break
		od;
		if
		:: k_ < tq_len && !FAIR && !rq_c[r] && hd_len < hd_room ->
			hd_t[hd_len] = tq_t[k_]; hd_at[hd_len] = tq_at[k_]; hd_exp[hd_len] = tq_exp[k_]; hd_len++
		:: else
		fi;
		if
		:: hd_len > 0 ->
			/* _HANDED_PERMITS: fenced one after another from the next fence, each counted from its
			 * place's at at the earliest (expressions.not_before) */
			next_fence(); hd_next = d_fence; hd_i = 0;
			do
			:: hd_i < hd_len ->
				issue_fence(hd_next + hd_i);
				c_code { check_handee(hd_t[hd_i], hd_exp[hd_i]); };
				tp_o[tp_len] = hd_t[hd_i]; tp_exp[tp_len] = (hd_at[hd_i] > srv -> hd_at[hd_i] : srv) + T;
				tp_fen[tp_len] = hd_next + hd_i; tp_len++; hd_i++
			:: else -> break
			od;
			d_fence = hd_next + hd_len - 1;
			/* handedOffTo, when another process's place got a permit: to each process it names a
			 * token of; the document's fence is the permit's only when one was handed (watcher._report) */
			f_ = 0; hd_i = 0;
			do
			:: hd_i < hd_len -> f_ = (f_ || hd_t[hd_i] != hd_sc); hd_i++
			:: else -> break
			od;
			if
			:: f_ ->
				hd_i = 0;
				do
				:: hd_i < hd_len ->
					z_ = ((hd_len == 1 || MUTATED(MUT_PERMIT_DOC_FENCE)) -> d_fence : 0);
					event(TOKEN_PROCESS(hd_t[hd_i]), E_HANDED, hd_t[hd_i], z_); hd_i++
				:: else -> break
				od
			:: else
			fi
		:: else ->
			/* freed: handed to nobody (served in turn: only when no candidate blocks it) */
			if
			:: !FAIR || tq_len == 0 -> freed_event_all()
			:: else
			fi
		fi;
		/* the queue: the candidates not handed to */
		j_ = 0; i_ = 0;
		do
		:: i_ < tq_len ->
			f_ = 0; k_ = 0;
			do
			:: k_ < hd_len -> f_ = (f_ || hd_t[k_] == tq_t[i_]); k_++
			:: else -> break
			od;
			if
			:: !f_ -> tq_t[j_] = tq_t[i_]; tq_at[j_] = tq_at[i_]; tq_exp[j_] = tq_exp[i_]; tq_n[j_] = tq_n[i_]; j_++
			:: else
			fi;
			i_++
		:: else -> break
		od;
		tq_len = j_;
		tq_store();
		/* releasedOwners: the owner appended, the last RR kept (the store keeps 64) */
		if
		:: !leaving ->
			k_ = 0;
			do
			:: k_ < RR && rr_o[k_] != 0 -> k_++
			:: else -> break
			od;
			if
			:: k_ == RR -> i_ = 1;
				do
				:: i_ < RR -> rr_o[i_-1] = rr_o[i_]; i_++
				:: else -> break
				od;
				k_ = RR - 1
			:: else
			fi;
			rr_o[k_] = x_
		:: else
		fi;
		holders_store()
	fi;
	/* withdrawn: remembered (also on a document not written yet: the attempt it withdraws may create it) */
	if
	:: leaving && !MUTATED(MUT_NO_WITHDRAWN) ->
		d_wd = d_wd | (1 << rq_tok[r]);
		if
		:: rq_a[r] != 0 -> d_wd = d_wd | (1 << rq_a[r])
		:: else
		fi
	:: else
	fi
}

/* ACTION permit_release: LockStore.release with permits (permit_release.release_pipeline), a findAndModify
 * matching a holder or a released owner (kinds.PermitQueries.release).
 * WRITES holders fence handedOffAt handedOffTo freed releasedAt releasedOwners queue expiresAt
 * Returns the owner's live permit and hands the weight it frees on (permits_release); a copy sent
 * again matches releasedOwners and changes nothing. */
inline psrv_release(r)
{
	x_ = rq_tok[r];
	holder_index(x_);
	b_ = 0; k_ = 0;
	do
	:: k_ < RR -> b_ = (b_ || rr_o[k_] == x_); k_++
	:: else -> break
	od;
	b_ = (b_ && !MUTATED(MUT_FORGET_RELEASES));
	if
	:: !d_ex || j_ == ph_len && !b_ -> rq_r1[r] = 0        /* nothing matched: None */
	:: else ->
		permits_release(r, 0);
		/* the reply (waiting._hand_over_once): the owner still listed (its permit had expired: None),
		 * else whether the successor holds a permit now, and its fence (LockState.fence_of) */
		rq_r1[r] = 1; rq_r3[r] = d_fence;
		holder_index(x_);
		if
		:: j_ < ph_len -> rq_r2[r] = x_
		:: else ->
			rq_r2[r] = 0;
			if
			:: rq_a[r] != 0 -> holder_index(rq_a[r]);
				if
				:: j_ < ph_len -> rq_r2[r] = rq_a[r]; rq_r3[r] = ph_fen[j_]
				:: else
				fi
			:: else
			fi
		fi
	fi
}

/* ACTION permit_withdraw: LockStore.leave with permits (permit_release.release_pipeline with leaving), an
 * upserting update.
 * WRITES holders fence handedOffAt handedOffTo freed releasedAt releasedOwners withdrawn queue expiresAt
 * Removes the places of the tokens, passes on a permit handed to one of them meanwhile, and remembers
 * the tokens as withdrawn. */
inline psrv_leave(r)
{
	if
	:: d_ex || !MUTATED(MUT_LEAVE_NO_UPSERT) -> d_ex = 1; permits_release(r, 1)
	:: else
	fi
}

/* ACTION permit_renew: LockStore.renew and LockStore.extend with permits (permits.renewal_pipeline),
 * matching the kind and a holder.
 * WRITES holders expiresAt
 * A new expiry a TTL from now for the owner's live permit; else nothing. */
inline psrv_renew(r)
{
	rq_r1[r] = 0;
	holder_index(rq_tok[r]);
	if
	:: d_ex && j_ < ph_len && (ph_exp[j_] > srv || MUTATED(MUT_RENEW_EXPIRED)) ->
		ph_exp[j_] = srv + T; rq_r1[r] = 1;
		d_exp = srv; i_ = 0;
		do
		:: i_ < ph_len -> d_exp = (ph_exp[i_] > d_exp -> ph_exp[i_] : d_exp); i_++
		:: else -> break
		od
	:: else
	fi
}

/* ACTION put_first: LockStore.put_candidate_first (permits.put_first_pipeline), a findAndModify matching
 * the kind, a holder owner and a place labelled label.
 * WRITES queue
 * Moves the oldest live place labelled `label` (a candidate's label is its process here: rq_a) to the
 * front of the queue; the reply says whether such a place is first now. */
inline psrv_put_first(r)
{
	holder_index(rq_tok[r]);
	k_ = 0;
	do
	:: k_ < q_len && TOKEN_PROCESS(q_t[k_]) != rq_a[r] -> k_++
	:: else -> break
	od;
	if
	:: !d_ex || j_ == ph_len || k_ == q_len -> rq_r1[r] = 0      /* nothing matched: None */
	:: else ->
		k_ = 0;
		do
		:: k_ < q_len && (TOKEN_PROCESS(q_t[k_]) != rq_a[r] || q_exp[k_] <= srv) -> k_++
		:: else -> break
		od;
		if
		:: k_ < q_len && k_ > 0 ->
			h_t = q_t[k_]; h_at = q_at[k_]; h_n = q_exp[k_]; u_ = q_n[k_];
			do
			:: k_ > 0 -> q_t[k_] = q_t[k_-1]; q_at[k_] = q_at[k_-1]; q_exp[k_] = q_exp[k_-1]; q_n[k_] = q_n[k_-1]; k_--
			:: else -> break
			od;
			q_t[0] = h_t; q_at[0] = h_at; q_exp[0] = h_n; q_n[0] = u_
		:: else
		fi;
		rq_r1[r] = (q_len > 0 && TOKEN_PROCESS(q_t[0]) == rq_a[r])
	fi
}

/* ACTION permit_force_release: reports.force_release_permits (permits.force_release_pipeline), matching
 * the kind.
 * WRITES forcedRelease holders limit fence queue freed releasedAt
 * The operator's break-glass: breaks every live permit (their holders still believe until their
 * deadlines), and `freed` wakes every process's waiters. */
inline psrv_force()
{
	i_ = 0;
	do
	:: i_ < ph_len ->
		if
		:: ph_exp[i_] > srv ->
			p_forced = p_forced | (1 << ph_o[i_]);
			w_ = 0;
			do
			:: w_ < NW -> if
				:: ts[w_] == TS_HOLD && ltok[w_] == ph_o[i_] -> lforced[w_] = 1
				:: else
				fi; w_++
			:: else -> break
			od
		:: else
		fi;
		i_++
	:: else -> break
	od;
	hd_next = d_exp; tp_len = 0; holders_store(); d_exp = hd_next;   /* (expiresAt is not written) */
	freed_event_all()
}

/* the server applies request r to a lock's document */
inline apply_lock(r)
{
	printf("%d/%d   server applies p%d's ", rt, srv, rq_p[r]);
	if
	:: rq_k[r] == K_ACQ -> printf("acquire tok=%d follower=%d enqueue=%d", rq_tok[r], rq_a[r], rq_b[r]); srv_acquire(r)
	:: rq_k[r] == K_REL -> printf("release tok=%d successor=%d (its follower %d) successor_first=%d", rq_tok[r], rq_a[r], rq_b[r], rq_c[r]); srv_release(r)
	:: rq_k[r] == K_LEAVE -> printf("withdrawal of %d %d", rq_tok[r], rq_a[r]); srv_leave(r)
	:: rq_k[r] == K_RENEW -> printf("renewal tok=%d", rq_tok[r]); srv_renew(r)
	:: rq_k[r] == K_REFRESH -> printf("place refresh tok=%d", rq_tok[r]); srv_refresh(r)
	fi;
	applied_trace(r)
}

inline applied_trace(r)
{
	if
	:: rq_by[r] == NONE -> printf(" (its caller gave up on it)")
	:: else
	fi;
	printf("\n");
	c_code { trace_doc(); }
}

/* the caller stops waiting for request q (its reply, if any, is dropped) */
inline abandon_req(q)
{
	if
	:: rq_st[q] == R_PEND -> rq_by[q] = NONE
	:: else -> free_req(q)
	fi
}

#define LEFT(u) ((u) > rt -> (u) - rt : 0)

inline free_req(r)
{
	rq_k[r] = 0; rq_p[r] = 0; rq_by[r] = 0; rq_tok[r] = 0; rq_a[r] = 0; rq_b[r] = 0; rq_c[r] = 0; rq_st[r] = 0;
	rq_hold[r] = 0; rq_ready[r] = 0; rq_bound[r] = 0; rq_r1[r] = 0; rq_r2[r] = 0; rq_r3[r] = 0
}

/* a request sent now, awaited by `by`, cut by its caller's bound after `bound` ticks; its index in q */
inline send(q, p, kind, by, tok, a, b, c, bound)
{
	q = 0;
	do
	:: q < NR && rq_k[q] != 0 -> q++
	:: else -> break
	od;
	assert(q < NR);
	rq_k[q] = kind; rq_p[q] = p; rq_by[q] = by; rq_tok[q] = tok; rq_a[q] = a; rq_b[q] = b; rq_c[q] = c;
	rq_st[q] = R_PEND; rq_hold[q] = 0; rq_bound[q] = rt + (bound)
}

/* ================================================================================================
 * A process's waiting (queues.LocalQueue's transitions, named as there)
 * ============================================================================================== */

inline new_token(p, t)
{
	ntk[p]++;
	assert(ntk[p] <= TPP);
	t = (p) * TPP + ntk[p]
}

/* _first_in_line */
inline first_in_line(p, w)
{
	tu[w] = ((lq_pl[p] != STORED || tses[w]) -> DUE : PLACED)
}

/* _placed: a request sent at `at` left place a (follower b) in the server's queue, or none (a = 0) */
inline placed(p, a, b, at, fen)
{
	if
	:: a != 0 && a == lq_up[p] -> lq_up[p] = 0
	:: else
	fi;
	if
	:: a == 0 || a != lq_slot[p] -> lq_look[p] = NONE
	:: else
	fi;
	lq_slot[p] = a;
	lq_pl[p] = (a != 0 -> STORED : ABSENT);
	lq_pw[p] = (a != 0 -> at : 0); lq_pf[p] = (a != 0 -> fen : 0); lq_pfol[p] = b
}

/* on_news */
inline on_news(p)
{
	if
	:: lq_on[p] && lq_n[p] > 0 && (tu[lq_w[(p)*NT]] == PLACED || tu[lq_w[(p)*NT]] == BACKOFF || tu[lq_w[(p)*NT]] == ATTEMPTING) ->
		tu[lq_w[(p)*NT]] = DUE
	:: else
	fi
}

hidden byte o_;
/* on_taken: the place got the lease; the first waiter is granted it (b_ = 0: nobody waits) */
hidden byte ot_tok, ot_fen, ot_at, ot_fol;
inline on_taken(p, tok, fen, at, fol)
{
	ot_tok = tok; ot_fen = fen; ot_at = at; ot_fol = fol;   /* (the arguments may be fields placed() changes) */
	placed(p, ot_fol, 0, ot_at, ot_fen);
	if
	:: lq_n[p] == 0 -> b_ = 0
	:: else ->
		b_ = 1;
		o_ = lq_w[(p)*NT];
		printf("%d/%d   p%d: tok %d granted to t%d\n", rt, srv, p, ot_tok, o_);
		gtok[o_] = ot_tok; gfen[o_] = ot_fen; gsent[o_] = ot_at; tu[o_] = GRANTED;
		k_ = 1;
		do
		:: k_ < lq_n[p] -> lq_w[(p)*NT + k_ - 1] = lq_w[(p)*NT + k_]; k_++
		:: else -> break
		od;
		lq_n[p]--; lq_w[(p)*NT + lq_n[p]] = 0;
		if
		:: lq_n[p] > 0 -> first_in_line(p, lq_w[(p)*NT])
		:: else
		fi
	fi
}

/* on_handed_to_place: the stream saw the lease handed to this process's place */
inline on_handed_to_place(p, tok, fen)
{
	if
	:: lq_on[p] && lq_n[p] > 0 && tok == lq_slot[p] ->
		o_ = lq_w[(p)*NT];
		if
		/* (fen 0: the event named several permits, and no fence: queues.on_handed_to_place claims it) */
		:: tu[o_] == PLACED && lq_rif[p] == 0 && rt - lq_pw[p] <= FRESH && fen != 0 && (fen > lq_pf[p] || MUTATED(MUT_NO_FENCE_CHECK)) ->
			on_taken(p, tok, fen, lq_pw[p], lq_pfol[p])
		:: else -> on_news(p)
		fi
	:: else
	fi
}

/* head_place: the slot (a new token if none) and the follower: the second waiter's, else the one
 * the place may record (named again while it may be there, its waiter gone or not: a claim that
 * named none would leave that place queued, unknown here) */
inline head_place(p, a, b)
{
	if
	:: lq_slot[p] == 0 -> new_token(p, lq_slot[p])
	:: else
	fi;
	if
	:: lq_n[p] > 1 && lq_up[p] == 0 && !PERMITS -> new_token(p, lq_up[p])
	:: else
	fi;
	a = lq_slot[p];
	/* (a document of permits' queue has no followers: LocalQueue(followers=False), whose next waiter
	 * attempts at once, a permit may still be free) */
	b = (PERMITS -> 0 : (lq_n[p] > 1 -> lq_up[p] : (MUTATED(MUT_FOLLOWER_FORGOTTEN) -> 0 : lq_pfol[p])))
}

/* queues.join: queue w last, making the queue if nobody waits */
inline join(p, w)
{
	if
	:: !lq_on[p] ->
		lq_on[p] = 1; lq_gen[p] = (lq_gen[p] + 1) % 4; lq_slot[p] = 0; lq_pl[p] = ABSENT; lq_pw[p] = 0; lq_pf[p] = 0; lq_pfol[p] = 0;
		lq_up[p] = 0; lq_rif[p] = 0; lq_look[p] = NONE; lq_streak[p] = 0
	:: else
	fi;
	lq_w[(p)*NT + lq_n[p]] = w; lq_n[p]++;
	tu[w] = QUEUED; tses[w] = 0;
	if
	:: lq_n[p] == 1 -> first_in_line(p, w)
	:: else
	fi
}

/* a withdrawal of tokens a, b in the background (waiting.withdraw), retried until `until`; its slot in s */
inline start_withdrawal(p, a, b, until, s)
{
	s = 0;
	do
	:: s < NWD && wd_s[(p)*NWD + s] != WD_FREE -> s++
	:: else -> break
	od;
	assert(s < NWD);
	wd_s[(p)*NWD + s] = WD_SEND; wd_t1[(p)*NWD + s] = a; wd_t2[(p)*NWD + s] = b;
	wd_until[(p)*NWD + s] = until; wd_at[(p)*NWD + s] = rt; wd_req[(p)*NWD + s] = NONE; wd_by[(p)*NWD + s] = NONE
}

hidden byte s_;
/* queues.leave and the finally of wait_for_lease: w stops waiting; if nobody else waits, the queue is
 * unregistered and its places withdrawn (awaited by w for SLACK at most) */
inline leave_queue(p, w)
{
	b_ = (lq_n[p] > 0 && lq_w[(p)*NT] == w);                  /* was_head */
	k_ = 0;
	do
	:: k_ < lq_n[p] && lq_w[(p)*NT + k_] != w -> k_++
	:: else -> break
	od;
	if
	:: k_ < lq_n[p] ->
		do
		:: k_ + 1 < lq_n[p] -> lq_w[(p)*NT + k_] = lq_w[(p)*NT + k_ + 1]; k_++
		:: else -> break
		od;
		lq_n[p]--; lq_w[(p)*NT + lq_n[p]] = 0
	:: else
	fi;
	if
	:: b_ && MUTATED(MUT_LOOK_PER_HEAD) -> lq_look[p] = NONE
	:: else
	fi;
	if
	:: b_ && lq_n[p] > 0 -> first_in_line(p, lq_w[(p)*NT])
	:: else
	fi;
	twd[w] = NONE;
	if
	:: lq_n[p] == 0 ->
		lq_on[p] = 0;
		/* a release in flight that named its successor from this queue keeps the queue as it is */
		g_ = (p) * NT;
		do
		:: g_ < (p) * NT + NT -> if
			:: ts[g_] == TS_REL && rgen[g_] == lq_gen[p] -> rqslot[g_] = lq_slot[p]
			:: else
			fi; g_++
		:: else -> break
		od;
		kp_on[p] = 0; kp_due[p] = 0; kp_gen[p] = 0;
		if
		:: lq_pl[p] != ABSENT && !MUTATED(MUT_NO_WITHDRAWAL) ->
			start_withdrawal(p, lq_slot[p], lq_pfol[p], rt + T, s_);
			wd_by[(p)*NWD + s_] = w; twd[w] = s_; twdend[w] = rt + SLACK
		:: else
		fi;
		lq_slot[p] = 0; lq_pl[p] = ABSENT; lq_pw[p] = 0; lq_pf[p] = 0; lq_pfol[p] = 0; lq_up[p] = 0;
		lq_look[p] = NONE; lq_streak[p] = 0
	:: else
	fi
}

/* ================================================================================================
 * Tasks
 * ============================================================================================== */

inline clear_attempt(w)
{
	treq[w] = NONE; tptok[w] = 0; tpfol[w] = 0; tsent[w] = 0; tcov[w] = 0; twses[w] = 0; tline[w] = 0
}

inline clear_wait(w)
{
	tu[w] = QUEUED; tgu[w] = NONE; tat[w] = NONE; tses[w] = 0; tatt[w] = 0
}

/* an acquisition is over (returned False, released, lost, cancelled, failed) */
inline finish(w)
{
	if
	:: tputf[w] && treq[w] != NONE -> abandon_req(treq[w])
	:: else
	fi;
	tputf[w] = 0;
	clear_wait(w); clear_attempt(w);
	tcan[w] = 0; gtok[w] = 0; gfen[w] = 0; gsent[w] = 0;
	ltok[w] = 0; lfen[w] = 0; ldl[w] = 0; lforced[w] = 0; lrdue[w] = 0; lrsent[w] = 0;
	if
	:: lren[w] != NONE -> abandon_req(lren[w]); lren[w] = NONE
	:: else
	fi;
	rtok[w] = 0; rsucc[w] = 0; rsfol[w] = 0; rgen[w] = NONE; rqslot[w] = 0; rfirst[w] = 0; runtil[w] = 0; tthen[w] = 0;
	rheld[w] = 0; rdone[w] = 0; twd[w] = NONE; twdend[w] = 0;
	tacq[w]--;
	ts[w] = (tacq[w] > 0 -> TS_IDLE : TS_DONE)
}

/* waiting._hand_over_once: the release request (with the first waiter's place as successor) */
inline send_release(p, w)
{
	tat[w] = NONE;
	if
	:: lq_on[p] && lq_n[p] > 0 ->
		head_place(p, rsucc[w], rsfol[w]);
		lq_rif[p]++;
		rgen[w] = lq_gen[p]
	:: else -> rsucc[w] = 0; rsfol[w] = 0; rgen[w] = NONE
	fi;
	c_ = (lq_on[p] && lq_streak[p] < STREAK);
	bd_ = LEFT(runtil[w]);
	send(treq[w], p, K_REL, BY_TASK(w), rtok[w], rsucc[w], rsfol[w], c_, bd_);
	printf("%d/%d t%d (p%d) sends the release of %d, successor %d follower %d\n", rt, srv, w, p, rtok[w], rsucc[w], rsfol[w]);
	ts[w] = TS_REL
}

/* waiting.hand_over: release lease `tok`, retried until `until` */
inline start_release(p, w, tok, until, then)
{
	printf("%d/%d t%d (p%d) releases tok %d (until %d)\n", rt, srv, w, p, tok, until);
	rtok[w] = tok; runtil[w] = until; rfirst[w] = rt; tthen[w] = then; rheld[w] = 0; rdone[w] = 0;
	send_release(p, w)
}

/* lock._hold: the grant becomes the task's lease, unless its local deadline has passed */
inline hold(p, w)
{
	if
	:: rt >= gsent[w] + T - M && !MUTATED(MUT_DEADLINE_FROM_REPLY) ->
		printf("%d/%d t%d (p%d) granted tok %d too late to hold it: hands it on\n", rt, srv, w, p, gtok[w]);
		g_ = gtok[w]; gtok[w] = 0; gfen[w] = 0; gsent[w] = 0;
		start_release(p, w, g_, rt + T, THEN_REWAIT)
	:: else ->
		/* P2: fencing tokens only go up */
		printf("%d/%d t%d (p%d) HOLDS tok %d fence %d, believes until %d\n", rt, srv, w, p, gtok[w], gfen[w], gsent[w] + T - M);
		/* (a lease an operator broke before its reply came is exempt: its reply can come after a
		 * later holder's, see srv_force. A semaphore's holders hold at once, each its own permit: the
		 * order in which they start holding is not the order of their fences, which the server
		 * judges as it issues them, see issue_fence) */
		if
		:: gfen[w] <= fence_seen && !FORCED(gtok[w]) && KIND != KIND_SEMAPHORE ->
			c_code { uerror("P2 fencing: a holder's fencing token not above every earlier one"); }
		:: else
		fi;
		/* P2: a permit's holder holds it with its own permit's fencing token (the document lists it:
		 * a holder starts before its local deadline, so before the permit's expiry) */
		if
		:: PERMITS && !FORCED(gtok[w]) -> holder_index(gtok[w]);
			if
			:: j_ == ph_len || ph_fen[j_] != gfen[w] ->
				c_code { uerror("P2 fencing: a holder's fencing token is not its own permit's"); }
			:: else
			fi
		:: else
		fi;
		fence_seen = (gfen[w] > fence_seen -> gfen[w] : fence_seen);
		ltok[w] = gtok[w]; lfen[w] = gfen[w]; ldl[w] = (MUTATED(MUT_DEADLINE_FROM_REPLY) -> rt : gsent[w]) + T - M;
		if
		:: MUTATED(MUT_LEADER_UNTIL_TOLD) -> ldl[w] = NONE
		:: else
		fi;
		lrdue[w] = rt + 1; lren[w] = NONE; lforced[w] = FORCED(gtok[w]);   /* broken before its reply came */
		gtok[w] = 0; gfen[w] = 0; gsent[w] = 0;
		clear_wait(w);
		ts[w] = TS_HOLD
	fi
}

/* wait_for_lease has returned (the grant, or None): acquire goes on */
inline after_wait(p, w)
{
	twd[w] = NONE; twdend[w] = 0;
	if
	:: gtok[w] != 0 -> hold(p, w)
	:: else -> finish(w)
	fi
}

/* the finally of wait_for_lease */
inline stop_waiting(p, w)
{
	clear_attempt(w);
	leave_queue(p, w);
	if
	:: twd[w] != NONE -> ts[w] = TS_LEAVE
	:: else -> after_wait(p, w)
	fi
}

/* _sleep_without_news: a TTL while the stream reports news, else backoff (a tick) */
#define SLEEP(p) (MUTATED(MUT_OVERSLEEP) -> H + 1 : (STREAMING(p) -> T : 1))

/* the first waiter's attempt (waiting._attempt, up to the request) */
inline attempt(p, w)
{
	head_place(p, tptok[w], tpfol[w]);
	tcov[w] = STREAMING(p);
	twses[w] = (!tcov[w] && (tatt[w] || tses[w]));
	tu[w] = ATTEMPTING; lq_look[p] = NONE;
	tsent[w] = rt;
	printf("%d/%d t%d (p%d) attempts: slot %d follower %d%d\n", rt, srv, w, p, tptok[w], tpfol[w], 0);
	/* bounded by the TTL; and by the acquire's timeout when nobody waits behind it, else it belongs
	 * to the line (it runs on past that timeout, and its reply goes to the first waiter then) */
	x_ = T;
	ln_was = (tgu[w] != NONE && (tgu[w] <= rt || tgu[w] - rt < T) && lq_n[p] > 1 && !MUTATED(MUT_ATTEMPT_PER_WAITER));
	if
	:: ln_was -> tline[w] = 1
	:: !ln_was && tgu[w] != NONE && tgu[w] > rt && tgu[w] - rt < T -> x_ = tgu[w] - rt
	:: !ln_was && tgu[w] != NONE && tgu[w] <= rt -> x_ = 0
	:: else
	fi;
	send(treq[w], p, K_ACQ, BY_TASK(w), tptok[w], tpfol[w], 1, 0, x_);
	tatt[w] = 1
}

/* one turn of wait_for_lease's loop, for a task awaiting nothing */
#define WAIT_DUE(p, w) (tu[w] == DUE && lq_rif[p] == 0)
#define WAIT_TIMED(p, w) (tgu[w] != NONE && rt >= tgu[w] && (tatt[w] || !WAIT_DUE(p, w)))
#define WAIT_GUARD(p, w) (WAIT_TIMED(p, w) || WAIT_DUE(p, w) || tu[w] == GRANTED \
	|| tu[w] == PLACED && (lq_look[p] == NONE || rt >= lq_look[p] || !kp_on[p]) \
	|| tu[w] == BACKOFF && (tat[w] == NONE || rt >= tat[w] || !kp_on[p]))

inline keep_place(p)
{
	if
	:: !kp_on[p] -> kp_on[p] = 1; kp_due[p] = rt + 1; kp_gen[p] = lq_gen[p]
	:: else
	fi
}

inline wait_turn(p, w)
{
	/* what the loop does next: f_ = 0 sleep, 1 stop waiting (timed out, or granted), 2 attempt */
	f_ = 0;
	if
	:: WAIT_TIMED(p, w) || tu[w] == GRANTED -> f_ = 1
	:: else
	fi;
	if
	:: f_ == 0 && !WAIT_DUE(p, w) && tu[w] == PLACED ->
		if
		:: lq_look[p] == NONE -> lq_look[p] = rt + SLEEP(p)
		:: else
		fi;
		if
		:: rt >= lq_look[p] -> tu[w] = DUE; f_ = (WAIT_TIMED(p, w) -> 1 : 0)   /* and the loop goes round */
		:: else -> keep_place(p)
		fi
	:: f_ == 0 && !WAIT_DUE(p, w) && tu[w] == BACKOFF ->
		if
		:: tat[w] == NONE -> tat[w] = rt + 1
		:: else
		fi;
		if
		:: rt >= tat[w] -> tu[w] = DUE; f_ = (WAIT_TIMED(p, w) -> 1 : 0)
		:: else -> keep_place(p)
		fi
	:: else
	fi;
	if
	:: f_ == 0 && WAIT_DUE(p, w) -> f_ = 2
	:: else
	fi;
	if
	:: f_ == 1 ->
		if
		:: tu[w] == GRANTED -> printf("%d/%d t%d (p%d) granted: stops waiting\n", rt, srv, w, p)
		:: else -> printf("%d/%d t%d (p%d) gives up waiting (its timeout)\n", rt, srv, w, p)
		fi;
		stop_waiting(p, w)
	:: f_ == 2 -> attempt(p, w)
	:: else
	fi
}

/* the attempt's reply (or its failure, or the bound passing) reaches waiting._attempt */
inline attempt_done(p, w)
{
	x_ = treq[w];
	if
	:: tcan[w] ->
		/* cancelled in flight: on_attempt_abandoned, and the cancellation propagates */
		printf("%d/%d t%d (p%d) attempt ends, its caller cancelled: slot %d uncertain\n", rt, srv, w, p, tptok[w]);
		if
		:: lq_slot[p] == tptok[w] -> lq_pl[p] = UNCERTAIN; lq_pfol[p] = (tpfol[w] != 0 -> tpfol[w] : lq_pfol[p])
		:: else
		fi;
		tcan[w] = 0;
		abandon_req(x_);
		cancelled_waiting(p, w)
	:: !tcan[w] && (rq_st[x_] != R_OK || rt >= rq_bound[x_]) ->
		/* failed in transit (it may have been applied): on_attempt_failed */
		printf("%d/%d t%d (p%d) attempt failed in transit (%d): place uncertain, backs off\n", rt, srv, w, p, rq_st[x_]);
		lq_pl[p] = UNCERTAIN; lq_pfol[p] = (tpfol[w] != 0 -> tpfol[w] : lq_pfol[p]);
		tses[w] = 0;
		if
		:: tu[w] == ATTEMPTING -> tat[w] = NONE; tu[w] = BACKOFF
		:: else
		fi;
		abandon_req(x_);
		clear_attempt(w)
	:: else ->
		printf("%d/%d t%d (p%d) attempt reply: owner is tok %d=%d, fence %d, look again in %d\n", rt, srv, w, p, tptok[w], rq_r1[x_], rq_r2[x_], rq_r3[x_]);
		if
		:: tu[w] == GRANTED || lq_slot[p] != tptok[w] -> skip   /* a release of this process handed it the lease */
		:: else ->
			if
			:: rq_r1[x_] ->
				lq_streak[p] = 0;
				on_taken(p, tptok[w], rq_r2[x_], tsent[w], tpfol[w]);
				if
				:: tpfol[w] != 0 && lq_n[p] > 0 && !tcov[w] && !twses[w] ->
					o_ = lq_w[(p)*NT]; tses[o_] = 1; tu[o_] = DUE       /* on_place_uncovered */
				:: tpfol[w] != 0 && lq_n[p] > 0 && !tcov[w] && twses[w] && st[p] == 0 ->
					st[p] = 1; stw[p] = 1                               /* cover_from starts the stream */
				:: else
				fi
			:: else ->
				if
				:: !tcov[w] && twses[w] && st[p] == 0 -> st[p] = 1; stw[p] = 1; tcov[w] = 1
				:: !tcov[w] && twses[w] && st[p] != 0 -> tcov[w] = 1
				:: else
				fi;
				/* on_placed */
				placed(p, tptok[w], tpfol[w], tsent[w], rq_r2[x_]);
				if
				:: tu[w] == ATTEMPTING ->
					tses[w] = !tcov[w];
					if
					:: tcov[w] ->
						tu[w] = PLACED;
						lq_look[p] = rt + (rq_r3[x_] < SLEEP(p) && !MUTATED(MUT_OVERSLEEP) -> rq_r3[x_] : SLEEP(p))
					:: else -> tu[w] = DUE
					fi
				:: else
				fi
			fi
		fi;
		free_req(x_);
		ln_was = tline[w];
		clear_attempt(w);
		if
		:: ln_was && tu[w] == ATTEMPTING -> first_in_line(p, w)   /* on_line_attempt_done */
		:: else
		fi
	fi;
	if
	:: ts[w] == TS_WAIT && treq[w] == NONE -> wait_turn(p, w)
	:: else
	fi
}

/* a task whose attempt belongs to the line stops waiting (its timeout passed, a release of its
 * process granted it, or it was cancelled) with the attempt in flight: the attempt is the next first
 * waiter's now (on_left: ATTEMPTING); with nobody left, what it writes is uncertain, and withdrawn */
inline line_leaves(p, w, cancelled)
{
	printf("%d/%d t%d (p%d) stops waiting with the line's attempt in flight\n", rt, srv, w, p);
	ln_req = treq[w]; ln_tok = tptok[w]; ln_fol = tpfol[w]; ln_sent = tsent[w]; ln_cov = tcov[w]; ln_ses = twses[w];
	clear_attempt(w);
	if
	:: lq_n[p] == 0 || lq_n[p] == 1 && lq_w[(p)*NT] == w ->
		lq_pl[p] = UNCERTAIN; lq_pfol[p] = (ln_fol != 0 -> ln_fol : lq_pfol[p]);
		abandon_req(ln_req); ln_req = NONE
	:: else
	fi;
	if
	:: cancelled -> cancelled_waiting(p, w)
	:: else -> stop_waiting(p, w)
	fi;
	if
	:: ln_req != NONE ->
		o_ = lq_w[(p)*NT];
		printf("%d/%d   p%d: the line's attempt is t%d's now\n", rt, srv, p, o_);
		treq[o_] = ln_req; tptok[o_] = ln_tok; tpfol[o_] = ln_fol; tsent[o_] = ln_sent; tcov[o_] = ln_cov;
		twses[o_] = ln_ses; tline[o_] = 1; tu[o_] = ATTEMPTING; rq_by[ln_req] = BY_TASK(o_)
	:: else
	fi;
	ln_req = 0; ln_tok = 0; ln_fol = 0; ln_sent = 0; ln_cov = 0; ln_ses = 0
}

/* the release's reply reaches waiting._hand_over_once */
inline release_done(p, w)
{
	x_ = treq[w];
	treq[w] = NONE;
	c_ = (rgen[w] != NONE && lq_on[p] && rgen[w] == lq_gen[p]);   /* the queue it named is the current one */
	if
	:: c_ -> lq_rif[p]--                                            /* on_release_done */
	:: else
	fi;
	if
	:: tcan[w] ->
		/* cancelled meanwhile: the request ran to its end, and the cancellation propagates */
		printf("%d/%d t%d (p%d) release ends, its caller cancelled: the reply is not looked at\n", rt, srv, w, p);
		tcan[w] = 0;
		abandon_req(x_);
		hand_over_returned(p, w)
	:: !tcan[w] && (rq_st[x_] != R_OK || rt >= rq_bound[x_]) ->
		printf("%d/%d t%d (p%d) release failed in transit\n", rt, srv, w, p);
		abandon_req(x_);
		if
		:: rt + 1 >= runtil[w] -> hand_over_returned(p, w)        /* the error is raised */
		:: else -> tat[w] = rt + 1; ts[w] = TS_RELB
		fi
	:: else ->
		printf("%d/%d t%d (p%d) release reply: matched %d owner %d fence %d\n", rt, srv, w, p, rq_r1[x_], rq_r2[x_], rq_r3[x_]);
		/* the state: None if nothing matched, or if the lease is still ours (it had expired) */
		e_ = (rq_r1[x_] && rq_r2[x_] != rtok[w]);
		/* P8 (promise 4): a holder's release reports its lease lost only if no copy of it ended the live
		 * lease (a copy sent again after a lost reply recognises the first one's success) */
		if
		:: rheld[w] && rdone[w] && !e_ ->
			c_code { uerror("P8 release: a release that ended its live lease reported the lease lost"); }
		:: else
		fi;
		/* the slot of the queue it named the successor from */
		g_ = (c_ -> lq_slot[p] : rqslot[w]);
		if
		:: rgen[w] == NONE -> skip
		:: rgen[w] != NONE && !e_ -> if
			:: c_ -> on_news(p)
			:: else
			fi
		:: rgen[w] != NONE && e_ && rq_r2[x_] == rsucc[w] && g_ == rsucc[w] ->
			/* handed to the successor: the first waiter has it */
			b_ = 0;
			if
			:: c_ -> on_taken(p, rsucc[w], rq_r3[x_], rfirst[w], rsfol[w])
			:: else
			fi;
			if
			:: b_ -> lq_streak[p]++
			:: else ->
				/* _HandedToNobody: pass it on, and withdraw the follower that write queued */
				printf("%d/%d t%d (p%d) handed to %d, whose waiters are gone: withdraws it\n", rt, srv, w, p, rsucc[w]);
				start_withdrawal(p, rsucc[w], rsfol[w], runtil[w], s_);
				wd_by[(p)*NWD + s_] = w; twd[w] = s_
			fi
		:: rgen[w] != NONE && e_ && rq_r2[x_] == rsucc[w] && g_ != rsucc[w] -> skip   /* its own attempt took it first */
		:: rgen[w] != NONE && e_ && rq_r2[x_] != rsucc[w] ->
			/* on_lease_went_elsewhere */
			if
			:: c_ ->
				lq_streak[p] = 0;
				if
				:: lq_slot[p] == rsucc[w] -> placed(p, rsucc[w], rsfol[w], rfirst[w], rq_r3[x_])
				:: else
				fi
			:: else
			fi
		fi;
		free_req(x_);
		if
		:: twd[w] != NONE -> ts[w] = TS_RELW
		:: else -> hand_over_returned(p, w)
		fi
	fi
}

inline hand_over_returned(p, w)
{
	g_ = tthen[w];
	rtok[w] = 0; rsucc[w] = 0; rsfol[w] = 0; rgen[w] = NONE; rqslot[w] = 0; rfirst[w] = 0; runtil[w] = 0; tthen[w] = 0;
	rheld[w] = 0; rdone[w] = 0; tat[w] = NONE;
	if
	:: g_ == THEN_REWAIT -> ts[w] = TS_WAIT; tatt[w] = 0; join(p, w)
	:: g_ == THEN_LEAVE -> ts[w] = TS_WAIT; stop_waiting(p, w)
	:: else -> finish(w)
	fi
}

/* wait_for_lease's except CancelledError: a grant made meanwhile is handed on first; then its
 * finally (leave, withdraw) */
inline cancelled_waiting(p, w)
{
	if
	:: tu[w] == GRANTED && gtok[w] != 0 ->
		g_ = gtok[w]; gtok[w] = 0; gfen[w] = 0; gsent[w] = 0;
		clear_attempt(w);
		start_release(p, w, g_, rt + T, THEN_LEAVE)
	:: else -> gtok[w] = 0; gfen[w] = 0; gsent[w] = 0; stop_waiting(p, w)
	fi
}

/* a non-blocking acquire (lock._try_once) */
inline try_done(p, w)
{
	x_ = treq[w];
	treq[w] = NONE;
	if
	:: tcan[w] ->
		/* on_cancelled: hand on what it took */
		tcan[w] = 0;
		if
		:: rq_st[x_] == R_OK && rt < rq_bound[x_] && rq_r1[x_] -> free_req(x_); start_release(p, w, tptok[w], rt + T, THEN_FINISH)
		:: else -> abandon_req(x_); finish(w)
		fi
	:: !tcan[w] && (rq_st[x_] != R_OK || rt >= rq_bound[x_]) ->
		/* in transit: it may have been applied, so release what the token may hold, then raise */
		abandon_req(x_);
		start_release(p, w, tptok[w], rt + T, THEN_FINISH)
	:: else ->
		if
		:: rq_r1[x_] -> gtok[w] = tptok[w]; gfen[w] = rq_r2[x_]; gsent[w] = tsent[w]; free_req(x_); hold(p, w)
		:: else -> free_req(x_); finish(w)
		fi
	fi;
	tptok[w] = 0; tsent[w] = 0
}

/* the heartbeat's renewal of a task's lease (keeper.LeaseKeeper._renew) */
inline renew_done(p, w)
{
	x_ = lren[w];
	lren[w] = NONE;
	if
	:: rq_st[x_] == R_OK && rt < rq_bound[x_] ->
		if
		:: rq_r1[x_] -> ldl[w] = (ldl[w] == NONE -> NONE : lrsent[w] + T - M); lrdue[w] = lrsent[w] + 1
		:: else -> finish(w)      /* the server shows it expired or another's: lost at once */
		fi;
		free_req(x_)
	:: else ->
		if
		:: rq_st[x_] == R_PEND -> rq_by[x_] = NONE
		:: else -> free_req(x_)
		fi;
		lrdue[w] = rt + 1
	fi
}

/* election.resign(to=label): put the candidate labelled `label` (here: process q's) first in line,
 * bounded by the lease's local deadline; the release follows once that place is first */
inline resign_to(p, w, q)
{
	printf("%d/%d t%d (p%d) resigns to p%d's candidate: puts it first\n", rt, srv, w, p, q);
	send(treq[w], p, K_PUTFIRST, BY_TASK(w), ltok[w], q, 0, 0, (ldl[w] == NONE -> T - M : ldl[w] - rt));
	tputf[w] = 1
}

/* the put_first's reply: the place first now, then the resignation (the release); else (LookupError,
 * or an error on the way) the leader still leads */
inline put_first_done(p, w)
{
	x_ = treq[w]; treq[w] = NONE; tputf[w] = 0;
	c_ = (rq_st[x_] == R_OK && rt < rq_bound[x_] && rq_r1[x_]);
	abandon_req(x_);
	if
	:: c_ ->
		x_ = ltok[w]; y_ = (ldl[w] == NONE -> rt + T - M : ldl[w]);
		ltok[w] = 0; lfen[w] = 0; ldl[w] = 0; lforced[w] = 0; lrdue[w] = 0; lrsent[w] = 0;
		if
		:: lren[w] != NONE -> abandon_req(lren[w]); lren[w] = NONE
		:: else
		fi;
		y_ = (y_ + M > rt + 1 -> y_ + M : rt + 1); start_release(p, w, x_, y_, THEN_FINISH); rheld[w] = 1
	:: else -> printf("%d/%d t%d (p%d) no such candidate first: still leads\n", rt, srv, w, p)
	fi
}

/* the options of one task */
#define REPLY_READY(q) (rq_st[q] != R_PEND && rq_ready[q] <= rt || rt >= rq_bound[q])
#define LINE_LEAVES(p, w) (ts[w] == TS_WAIT && tline[w] && (WAIT_TIMED(p, w) || tu[w] == GRANTED))

#define TASK_URGENT(p, w) (RUNS(p) && ( \
	ts[w] == TS_WAIT && treq[w] == NONE && WAIT_GUARD(p, w) \
	|| treq[w] != NONE && REPLY_READY(treq[w]) \
	|| LINE_LEAVES(p, w) \
	|| ts[w] == TS_LEAVE && (wd_s[(p)*NWD + twd[w]] == WD_DONE || rt >= twdend[w]) \
	|| ts[w] == TS_HOLD && rt >= ldl[w] \
	|| HB && ts[w] == TS_HOLD && lren[w] == NONE && rt >= lrdue[w] \
	|| lren[w] != NONE && REPLY_READY(lren[w]) \
	|| ts[w] == TS_RELB && rt >= tat[w] \
	|| ts[w] == TS_RELW && wd_s[(p)*NWD + twd[w]] == WD_DONE))

#define TASK(p, w) \
	/* acquire() (when nothing else is due): blocking, with the task's timeout, or not blocking */ \
	:: d_step { RUNS(p) && ts[w] == TS_IDLE && tacq[w] > 0 && rt < H && (rt < START_BY || tacq[w] < ACQS) && !URGENT -> \
		if \
		:: TTO[w] == TO_TRY -> \
			new_token(p, tptok[w]); tsent[w] = rt; ts[w] = TS_TRY; \
			send(treq[w], p, K_ACQ, BY_TASK(w), tptok[w], 0, 0, 0, T) \
		:: else -> \
			ts[w] = TS_WAIT; tgu[w] = (TTO[w] == TO_NONE -> NONE : rt + TTO[w]); tatt[w] = 0; join(p, w) \
		fi; \
		printf("%d/%d t%d (p%d) acquire(), timeout %d\n", rt, srv, w, p, TTO[w]); check() } \
	/* wait_for_lease's loop */ \
	:: d_step { RUNS(p) && ts[w] == TS_WAIT && treq[w] == NONE && WAIT_GUARD(p, w) -> wait_turn(p, w); check() } \
	:: d_step { RUNS(p) && ts[w] == TS_WAIT && treq[w] != NONE && REPLY_READY(treq[w]) -> attempt_done(p, w); check() } \
	:: d_step { RUNS(p) && LINE_LEAVES(p, w) -> line_leaves(p, w, 0); check() } \
	:: d_step { RUNS(p) && ts[w] == TS_LEAVE && (wd_s[(p)*NWD + twd[w]] == WD_DONE || rt >= twdend[w]) -> \
		wd_by[(p)*NWD + twd[w]] = NONE; \
		if \
		:: wd_s[(p)*NWD + twd[w]] == WD_DONE -> wd_free(p, twd[w]) \
		:: else \
		fi; \
		after_wait(p, w); check() } \
	/* holding: the lease's deadline passes (lost; no release is sent), or the holder releases */ \
	:: d_step { RUNS(p) && ts[w] == TS_HOLD && rt >= ldl[w] -> \
		printf("%d/%d t%d (p%d) lost tok %d at its local deadline\n", rt, srv, w, p, ltok[w]); finish(w); check() } \
	:: d_step { RUNS(p) && ts[w] == TS_HOLD && rt < ldl[w] && !tputf[w] && !URGENT -> \
		x_ = ltok[w]; y_ = (ldl[w] == NONE -> rt + T - M : ldl[w]); \
		ltok[w] = 0; lfen[w] = 0; ldl[w] = 0; lforced[w] = 0; lrdue[w] = 0; lrsent[w] = 0; \
		if \
		:: lren[w] != NONE -> abandon_req(lren[w]); lren[w] = NONE \
		:: else \
		fi; \
		y_ = (y_ + M > rt + 1 -> y_ + M : rt + 1); start_release(p, w, x_, y_, THEN_FINISH); rheld[w] = 1; check() } \
	:: d_step { RUNS(p) && HB && ts[w] == TS_HOLD && lren[w] == NONE && rt >= lrdue[w] && rt < ldl[w] -> \
		lrsent[w] = rt; send(lren[w], p, K_RENEW, BY_RENEW(w), ltok[w], 0, 0, 0, (ldl[w] == NONE -> T - M : ldl[w] - rt)); check() } \
	:: d_step { RUNS(p) && lren[w] != NONE && REPLY_READY(lren[w]) -> renew_done(p, w); check() } \
	/* an election's leader resigns to the candidate of another process (election.resign(to=label)) */ \
	:: d_step { RUNS(p) && RESIGN_TO && ts[w] == TS_HOLD && rt < ldl[w] && !tputf[w] && !URGENT -> resign_to(p, w, (p + 1) % NP); check() } \
	:: d_step { RUNS(p) && RESIGN_TO && ts[w] == TS_HOLD && rt < ldl[w] && !tputf[w] && !URGENT -> resign_to(p, w, (p + 2) % NP); check() } \
	:: d_step { RUNS(p) && tputf[w] && REPLY_READY(treq[w]) -> put_first_done(p, w); check() } \
	/* releasing */ \
	:: d_step { RUNS(p) && ts[w] == TS_REL && REPLY_READY(treq[w]) -> release_done(p, w); check() } \
	:: d_step { RUNS(p) && ts[w] == TS_RELB && rt >= tat[w] -> send_release(p, w); check() } \
	:: d_step { RUNS(p) && ts[w] == TS_RELW && wd_s[(p)*NWD + twd[w]] == WD_DONE -> \
		wd_free(p, twd[w]); twd[w] = NONE; hand_over_returned(p, w); check() } \
	:: d_step { RUNS(p) && ts[w] == TS_TRY && REPLY_READY(treq[w]) -> try_done(p, w); check() } \
	/* cancelled (a fault): at an await of acquire, of the body, or of release */ \
	:: d_step { f_cancel > 0 && RUNS(p) && (ts[w] == TS_WAIT || ts[w] == TS_REL || ts[w] == TS_TRY) && treq[w] != NONE && !tcan[w] && !tline[w] -> \
		f_cancel--; tcan[w] = 1; printf("%d/%d t%d (p%d) CANCELLED while its request is in flight\n", rt, srv, w, p); check() } \
	:: d_step { f_cancel > 0 && RUNS(p) && ts[w] == TS_WAIT && tline[w] -> \
		f_cancel--; printf("%d/%d t%d (p%d) CANCELLED while the line's attempt is in flight\n", rt, srv, w, p); line_leaves(p, w, 1); check() } \
	:: d_step { f_cancel > 0 && RUNS(p) && ts[w] == TS_WAIT && treq[w] == NONE -> \
		f_cancel--; printf("%d/%d t%d (p%d) CANCELLED while it waits\n", rt, srv, w, p); cancelled_waiting(p, w); check() } \
	:: d_step { f_cancel > 0 && RUNS(p) && ts[w] == TS_HOLD && rt < ldl[w] && !tputf[w] -> \
		f_cancel--; printf("%d/%d t%d (p%d) CANCELLED in its body\n", rt, srv, w, p); \
		x_ = ltok[w]; y_ = (ldl[w] == NONE -> rt + T - M : ldl[w]); \
		ltok[w] = 0; lfen[w] = 0; ldl[w] = 0; lforced[w] = 0; lrdue[w] = 0; lrsent[w] = 0; \
		if \
		:: lren[w] != NONE -> abandon_req(lren[w]); lren[w] = NONE \
		:: else \
		fi; \
		y_ = (y_ + M > rt + 1 -> y_ + M : rt + 1); start_release(p, w, x_, y_, THEN_FINISH); rheld[w] = 1; check() }

inline wd_free(p, s)
{
	wd_s[(p)*NWD + s] = WD_FREE; wd_t1[(p)*NWD + s] = 0; wd_t2[(p)*NWD + s] = 0; wd_until[(p)*NWD + s] = 0;
	wd_at[(p)*NWD + s] = 0; wd_req[(p)*NWD + s] = 0; wd_by[(p)*NWD + s] = 0
}

/* ================================================================================================
 * A process's background: the heartbeat's places, its withdrawals, its change stream
 * ============================================================================================== */

#define KEEPER_DUE(p) (kp_on[p] && kp_req[p] == NONE && rt >= kp_due[p])
#define WD_URGENT(p, s) (wd_s[(p)*NWD + s] == WD_SEND || wd_s[(p)*NWD + s] == WD_BACK && rt >= wd_at[(p)*NWD + s] \
	|| wd_s[(p)*NWD + s] == WD_FLIGHT && REPLY_READY(wd_req[(p)*NWD + s]) \
	|| wd_s[(p)*NWD + s] == WD_DONE && wd_by[(p)*NWD + s] == NONE)
#define EV_READY(p, e) (ev_k[(p)*EV + e] != 0 && ev_at[(p)*EV + e] <= rt)
#define PROC_URGENT(p) (RUNS(p) && (KEEPER_DUE(p) || kp_req[p] != NONE && REPLY_READY(kp_req[p]) \
	|| WD_URGENT(p, 0) || WD_URGENT(p, 1) || st[p] == 1 && ANY_EVENT(p) \
	|| st[p] == 2 && rt >= stu[p] || stw[p]))

inline wake_all(p)
{
	on_news(p)
}

inline dispatch(p, e)
{
	printf("%d/%d p%d's stream: event %d tok %d fence %d\n", rt, srv, p, ev_k[(p)*EV + e], ev_t[(p)*EV + e], ev_f[(p)*EV + e]);
	if
	:: ev_k[(p)*EV + e] == E_HANDED -> on_handed_to_place(p, ev_t[(p)*EV + e], ev_f[(p)*EV + e])
	:: else -> on_news(p)
	fi;
	ev_k[(p)*EV + e] = 0; ev_t[(p)*EV + e] = 0; ev_f[(p)*EV + e] = 0; ev_at[(p)*EV + e] = 0
}

inline drop_events(p)
{
	k_ = 0;
	do
	:: k_ < EV -> ev_k[(p)*EV + k_] = 0; ev_t[(p)*EV + k_] = 0; ev_f[(p)*EV + k_] = 0; ev_at[(p)*EV + k_] = 0; k_++
	:: else -> break
	od
}

/* the first deliverable event (e_ = EV: none) */
inline first_event(p)
{
	e_ = 0;
	do
	:: e_ < EV && !EV_READY(p, e_) -> e_++
	:: else -> break
	od
}

#define ANY_EVENT(p) (EV_READY(p, 0) || EV_READY(p, 1) || EV_READY(p, 2))
#define EVENTS(p) \
	:: d_step { RUNS(p) && st[p] == 1 && ANY_EVENT(p) -> first_event(p); dispatch(p, e_); check() } \
	:: d_step { f_event > 0 && RUNS(p) && st[p] == 1 && ANY_EVENT(p) -> f_event--; first_event(p); \
		printf("%d/%d EVENT LOST: p%d's event %d tok %d\n", rt, srv, p, ev_k[(p)*EV + e_], ev_t[(p)*EV + e_]); \
		ev_k[(p)*EV + e_] = 0; ev_t[(p)*EV + e_] = 0; ev_f[(p)*EV + e_] = 0; ev_at[(p)*EV + e_] = 0; check() } \
	:: d_step { f_event > 0 && RUNS(p) && st[p] == 1 && ANY_EVENT(p) -> f_event--; first_event(p); \
		printf("%d/%d EVENT LATE: p%d's event %d tok %d\n", rt, srv, p, ev_k[(p)*EV + e_], ev_t[(p)*EV + e_]); \
		ev_at[(p)*EV + e_] = rt + 1; check() }

#define WITHDRAWAL(p, s) \
	:: d_step { RUNS(p) && (wd_s[(p)*NWD + s] == WD_SEND || wd_s[(p)*NWD + s] == WD_BACK && rt >= wd_at[(p)*NWD + s]) -> \
		bd_ = LEFT(wd_until[(p)*NWD + s]); \
		send(wd_req[(p)*NWD + s], p, K_LEAVE, BY_WD(p, s), wd_t1[(p)*NWD + s], wd_t2[(p)*NWD + s], 0, 0, bd_); \
		wd_s[(p)*NWD + s] = WD_FLIGHT; printf("%d/%d p%d withdraws %d %d\n", rt, srv, p, wd_t1[(p)*NWD + s], wd_t2[(p)*NWD + s]); check() } \
	:: d_step { RUNS(p) && wd_s[(p)*NWD + s] == WD_FLIGHT && REPLY_READY(wd_req[(p)*NWD + s]) -> \
		x_ = wd_req[(p)*NWD + s]; \
		if \
		:: rq_st[x_] == R_OK && rt < rq_bound[x_] -> wd_s[(p)*NWD + s] = WD_DONE; free_req(x_) \
		:: else -> \
			if \
			:: rq_st[x_] == R_PEND -> rq_by[x_] = NONE \
			:: else -> free_req(x_) \
			fi; \
			if \
			:: rt + 1 < wd_until[(p)*NWD + s] -> wd_s[(p)*NWD + s] = WD_BACK; wd_at[(p)*NWD + s] = rt + 1 \
			:: else -> wd_s[(p)*NWD + s] = WD_DONE   /* gives up: the places expire by themselves */ \
			fi \
		fi; \
		wd_req[(p)*NWD + s] = NONE; check() } \
	:: d_step { RUNS(p) && wd_s[(p)*NWD + s] == WD_DONE && wd_by[(p)*NWD + s] == NONE -> wd_free(p, s); check() }

#define PROCESS(p) \
	/* the heartbeat refreshes the place (forgetting a queue nobody waits in, or without a place) */ \
	:: d_step { RUNS(p) && KEEPER_DUE(p) -> \
		if \
		:: lq_on[p] && lq_n[p] > 0 && lq_pl[p] != ABSENT && lq_slot[p] != 0 && kp_gen[p] == lq_gen[p] -> \
			kp_slot[p] = lq_slot[p]; kp_sent[p] = rt; printf("%d/%d p%d's heartbeat refreshes place %d\n", rt, srv, p, lq_slot[p]); \
			send(kp_req[p], p, K_REFRESH, BY_KEEPER(p), lq_slot[p], 0, 0, 0, 1) \
		:: else -> kp_on[p] = 0; kp_due[p] = 0; kp_gen[p] = 0 \
		fi; check() } \
	:: d_step { RUNS(p) && kp_req[p] != NONE && REPLY_READY(kp_req[p]) -> \
		x_ = kp_req[p]; kp_req[p] = NONE; \
		kp_due[p] = kp_sent[p] + 1; \
		if \
		:: lq_on[p] && kp_gen[p] == lq_gen[p] && lq_slot[p] == kp_slot[p] -> \
			c_ = (rq_st[x_] == R_OK && rt < rq_bound[x_]); \
			if \
			:: c_ && rq_r1[x_] -> \
				lq_pw[p] = (lq_pw[p] > kp_sent[p] -> lq_pw[p] : kp_sent[p])  /* on_place_confirmed */ \
			:: c_ && !rq_r1[x_] || !c_ && MUTATED(MUT_REFRESH_FAILED_GONE) -> \
				lq_pl[p] = ABSENT; on_news(p); printf("%d/%d p%d's place %d is gone\n", rt, srv, p, kp_slot[p]) /* on_place_gone */ \
			:: !c_ && !MUTATED(MUT_REFRESH_FAILED_GONE) -> \
				lq_pl[p] = (lq_pl[p] != ABSENT -> UNCERTAIN : ABSENT); on_news(p);   /* on_place_unconfirmed */ \
				printf("%d/%d p%d's refresh of place %d failed in transit: uncertain\n", rt, srv, p, kp_slot[p]) \
			fi \
		:: else \
		fi; \
		if \
		:: rq_st[x_] == R_PEND -> rq_by[x_] = NONE \
		:: else -> free_req(x_) \
		fi; \
		kp_slot[p] = 0; kp_sent[p] = 0; check() } \
	WITHDRAWAL(p, 0) \
	WITHDRAWAL(p, 1) \
	/* the change stream */ \
	EVENTS(p) \
	:: d_step { RUNS(p) && stw[p] -> stw[p] = 0; wake_all(p); check() } \
	:: d_step { RUNS(p) && st[p] == 2 && rt >= stu[p] -> st[p] = 1; stu[p] = 0; wake_all(p); check() } \
	:: d_step { f_stream > 0 && RUNS(p) && st[p] == 1 -> f_stream--; printf("%d/%d STREAM FAILS: p%d\n", rt, srv, p); \
		drop_events(p); wake_all(p); \
		if \
		:: lq_on[p] && lq_n[p] > 0 -> st[p] = 2; stu[p] = rt + 1 \
		:: else -> st[p] = 0 \
		fi; check() } \
	/* paused past a TTL, or killed */ \
	:: d_step { f_pause > 0 && RUNS(p) -> f_pause--; printf("%d/%d PAUSED: p%d until %d\n", rt, srv, p, rt + T + 1); pz[p] = rt + T + 1; fr_since = NONE; fr_quiet = rt + T + T + 2; check() } \
	:: d_step { f_kill > 0 && alive[p] -> f_kill--; printf("%d/%d KILLED: p%d\n", rt, srv, p); kill(p); fr_since = NONE; fr_quiet = rt + T + 2; check() }

inline kill(p)
{
	alive[p] = 0; st[p] = 0; stw[p] = 0; drop_events(p);
	k_ = 0;
	do
	:: k_ < NR -> if
		:: rq_k[k_] != 0 && rq_p[k_] == p && rq_st[k_] == R_PEND -> rq_by[k_] = NONE
		:: rq_k[k_] != 0 && rq_p[k_] == p && rq_st[k_] != R_PEND -> free_req(k_)
		:: else
		fi; k_++
	:: else -> break
	od;
	w_ = (p) * NT;
	do
	:: w_ < (p) * NT + NT -> ts[w_] = TS_DONE; tacq[w_] = 0; clear_wait(w_); treq[w_] = NONE; tptok[w_] = 0; tpfol[w_] = 0;
		tsent[w_] = 0; tcov[w_] = 0; twses[w_] = 0; tcan[w_] = 0; gtok[w_] = 0; gfen[w_] = 0; gsent[w_] = 0;
		ltok[w_] = 0; lfen[w_] = 0; ldl[w_] = 0; lforced[w_] = 0; lren[w_] = NONE; lrdue[w_] = 0; lrsent[w_] = 0;
		rtok[w_] = 0; rsucc[w_] = 0; rsfol[w_] = 0; rgen[w_] = NONE; rqslot[w_] = 0; rfirst[w_] = 0; runtil[w_] = 0; tthen[w_] = 0;
		rheld[w_] = 0; rdone[w_] = 0; tputf[w_] = 0;
		twd[w_] = NONE; twdend[w_] = 0; w_++
	:: else -> break
	od;
	lq_on[p] = 0; lq_n[p] = 0; lq_slot[p] = 0; lq_pl[p] = 0; lq_pw[p] = 0; lq_pf[p] = 0; lq_pfol[p] = 0; lq_up[p] = 0;
	lq_rif[p] = 0; lq_look[p] = NONE; lq_streak[p] = 0; lq_gen[p] = 0;
	k_ = 0;
	do
	:: k_ < NT -> lq_w[(p)*NT + k_] = 0; k_++
	:: else -> break
	od;
	kp_on[p] = 0; kp_due[p] = 0; kp_req[p] = NONE; kp_slot[p] = 0; kp_sent[p] = 0; kp_gen[p] = 0;
	k_ = 0;
	do
	:: k_ < NWD -> wd_free(p, k_); k_++
	:: else -> break
	od
}

/* ================================================================================================
 * The server applies requests; time moves on
 * ============================================================================================== */

#define APPLICABLE(r) (rq_k[r] != 0 && rq_st[r] == R_PEND && rq_hold[r] <= rt)

inline applied(r)
{
	if
	:: rq_by[r] == NONE -> free_req(r)
	:: else
	fi
}

/* what follows a request's application: its reply (lost, delayed), or nothing if its caller gave up */
#define APPLIED(r) rq_st[r] = (rq_lose[r] -> R_ERR : R_OK); rq_lose[r] = 0; rq_ready[r] = (rq_slow[r] -> rt + HOLDT : 0); \
	rq_slow[r] = 0; applied(r); check()
/* a document of permits' writes, one d_step each (SPIN bounds the size of a d_step) */
#define PAPPLY(r, kind, what, write) \
	:: d_step { APPLICABLE(r) && PERMITS && rq_k[r] == kind -> \
		printf("%d/%d   server applies p%d's ", rt, srv, rq_p[r]); printf(what); \
		printf(" tok=%d successor=%d successor_first=%d", rq_tok[r], rq_a[r], rq_c[r]); \
		write(r); applied_trace(r); APPLIED(r) }

#define SERVER(r) \
	:: d_step { APPLICABLE(r) && !PERMITS -> apply_lock(r); APPLIED(r) } \
	PAPPLY(r, K_ACQ, "permit acquire", psrv_acquire) \
	PAPPLY(r, K_REL, "permit release", psrv_release) \
	PAPPLY(r, K_LEAVE, "permits withdrawal", psrv_leave) \
	PAPPLY(r, K_RENEW, "permit renewal", psrv_renew) \
	PAPPLY(r, K_REFRESH, "place refresh", srv_refresh) \
	PAPPLY(r, K_PUTFIRST, "put_first", psrv_put_first) \
	/* the reply is lost (the connection closes after the write), or the request fails unapplied */ \
	:: d_step { f_lost > 0 && APPLICABLE(r) && rq_by[r] != NONE && !rq_lose[r] -> f_lost--; rq_lose[r] = 1; \
		printf("%d/%d REPLY LOST: p%d's request of tok %d (it will be applied)\n", rt, srv, rq_p[r], rq_tok[r]); check() } \
	:: d_step { f_lost > 0 && APPLICABLE(r) && rq_by[r] != NONE && !rq_lose[r] -> f_lost--; rq_st[r] = R_ERR; \
		printf("%d/%d CONNECTION FAILS: p%d's request of tok %d is not applied\n", rt, srv, rq_p[r], rq_tok[r]); check() } \
	/* applied, its reply delayed on its way back (a slow network, a client descheduled) HOLDT ticks */ \
	:: d_step { f_slow > 0 && APPLICABLE(r) && rq_by[r] != NONE && !rq_lose[r] && !rq_slow[r] -> f_slow--; rq_slow[r] = 1; \
		printf("%d/%d REPLY DELAYED: p%d's request of tok %d (it will be applied)\n", rt, srv, rq_p[r], rq_tok[r]); \
		fr_since = NONE; fr_quiet = rt + HOLDT + T; check() } \
	/* a request whose caller gave up may never arrive */ \
	:: d_step { APPLICABLE(r) && rq_by[r] == NONE -> printf("%d/%d   p%d's abandoned request of tok %d never arrives\n", rt, srv, rq_p[r], rq_tok[r]); free_req(r); check() } \
	/* held by the server (a fail point's blockConnection, a slow primary) */ \
	:: d_step { f_hold > 0 && APPLICABLE(r) && rq_by[r] != NONE -> f_hold--; rq_hold[r] = rt + HOLDT; \
		printf("%d/%d HELD: p%d's request of tok %d waits at the server until %d\n", rt, srv, rq_p[r], rq_tok[r], rq_hold[r]); \
		fr_since = NONE; fr_quiet = rt + HOLDT + T; check() }

#define URGENT_R(r) APPLICABLE(r)
#define SERVER_URGENT (URGENT_R(0) || URGENT_R(1) || URGENT_R(2) || URGENT_R(3) || URGENT_R(4) || URGENT_R(5) \
	|| URGENT_R(6) || URGENT_R(7))

#if NP == 3 && NT == 2
#define TASKS_URGENT (TASK_URGENT(0, 0) || TASK_URGENT(0, 1) || TASK_URGENT(1, 2) || TASK_URGENT(1, 3) \
	|| TASK_URGENT(2, 4) || TASK_URGENT(2, 5))
#define PROCS_URGENT (PROC_URGENT(0) || PROC_URGENT(1) || PROC_URGENT(2))
#elif NP == 3 && NT == 1
#define TASKS_URGENT (TASK_URGENT(0, 0) || TASK_URGENT(1, 1) || TASK_URGENT(2, 2))
#define PROCS_URGENT (PROC_URGENT(0) || PROC_URGENT(1) || PROC_URGENT(2))
#elif NP == 2 && NT == 2
#define TASKS_URGENT (TASK_URGENT(0, 0) || TASK_URGENT(0, 1) || TASK_URGENT(1, 2) || TASK_URGENT(1, 3))
#define PROCS_URGENT (PROC_URGENT(0) || PROC_URGENT(1))
#elif NP == 2 && NT == 1
#define TASKS_URGENT (TASK_URGENT(0, 0) || TASK_URGENT(1, 1))
#define PROCS_URGENT (PROC_URGENT(0) || PROC_URGENT(1))
#elif NP == 2 && NT == 3
#define TASKS_URGENT (TASK_URGENT(0, 0) || TASK_URGENT(0, 1) || TASK_URGENT(0, 2) || TASK_URGENT(1, 3) \
	|| TASK_URGENT(1, 4) || TASK_URGENT(1, 5))
#define PROCS_URGENT (PROC_URGENT(0) || PROC_URGENT(1))
#else
#error "NP and NT: 3x2, 3x1, 2x2, 2x1 or 2x3"
#endif
#define URGENT (SERVER_URGENT || TASKS_URGENT || PROCS_URGENT)

/* ================================================================================================
 * The properties, checked after every step
 * ============================================================================================== */

c_code {
extern void (*uerror)(char *);
int Printf(const char *fmt, ...);
static const char *kind_name[] = {"?", "acquire", "release", "withdraw", "renew", "refresh_place"};
/* the document as the replay shows it after each write */
void trace_doc(void)
{
	int i;
	Printf("      doc: owner=%d expiresAt=%d fence=%d releasedOwner=%d recent=[", now.d_own, now.d_exp, now.d_fence, now.d_rel);
	for (i = 0; i < RR; i++) if (now.rr_o[i]) Printf(" %d<%d", now.rr_o[i], now.rr_u[i]);
	Printf(" ] queue=[");
	for (i = 0; i < now.q_len; i++) Printf(" {t=%d at=%d exp=%d n=%d}", now.q_t[i], now.q_at[i], now.q_exp[i], now.q_n[i]);
	Printf(" ] withdrawn=%x", now.d_wd);
	if (KIND != KIND_LOCK) {
		Printf(" holders=[");
		for (i = 0; i < now.ph_len; i++) Printf(" {o=%d exp=%d fence=%d}", now.ph_o[i], now.ph_exp[i], now.ph_fen[i]);
		Printf(" ]");
	}
	Printf("\n");
}
/* P3 (promise 6): a release hands the lease only to a token its process still keeps (a waiter's
 * place or its follower, a release's successor, an attempt's place in flight) or is withdrawing; a
 * killed process's places are exempt while they are live (nothing can withdraw them: they expire
 * within a TTL), never once they have expired (exp, on the server's clock). */
void check_handee(int tok, int exp)
{
	int p, w, s, kept = 0;
	if (tok == 0) return;
	p = (tok - 1) / TPP;
	if (!now.alive[p] && exp > now.srv) return;
	if (now.lq_on[p] && (now.lq_slot[p] == tok || now.lq_pfol[p] == tok || now.lq_up[p] == tok)) kept = 1;
	for (w = p * NT; w < p * NT + NT; w++) {
		if ((now.ts[w] == TS_REL || now.ts[w] == TS_RELB) && (now.rsucc[w] == tok || now.rsfol[w] == tok)) kept = 1;
		if (now.treq[w] != NONE && (now.tptok[w] == tok || now.tpfol[w] == tok)) kept = 1;
	}
	for (s = 0; s < NWD; s++)
		if (now.wd_s[p * NWD + s] != WD_FREE && (now.wd_t1[p * NWD + s] == tok || now.wd_t2[p * NWD + s] == tok)) kept = 1;
	if (!kept) uerror("P3 orphan: a release hands the lease to a place nobody keeps (a waiter that is gone)");
}
/* The properties (see model/README.md), judged after every step (check_properties() below). */
/* the clock stepped back: every ghost's allowance grows by the step */
void step_back_trackers(void)
{
	int k;
	if (KIND == KIND_LOCK) return;
	for (k = 0; k < NH; k++) if (now.pg_since[k] != NONE) now.pg_back[k] += DB;
}
static int believes_at(int w)
{
	return now.alive[w / NT] && now.ts[w] == TS_HOLD && now.rt < now.ldl[w];
}
/* The properties of a document of permits (a semaphore's, an election's), judged after every step. */
void check_permits(void)
{
	int w, i, k, believers = 0, believed_live = 0, waits = 0, ghosts = 0;
	unsigned char g_tok[NH], g_fen[NH], g_since[NH], g_back[NH];
	for (w = 0; w < NW; w++) {
		if (believes_at(w) && !now.lforced[w]) believers++;
		if (now.alive[w / NT] && now.pz[w / NT] <= now.rt && now.ts[w] == TS_WAIT && (now.tgu[w] == NONE || now.rt < now.tgu[w]))
			waits = 1;
	}
	/* P6 (semaphore) and P7 (election): never more holders believing they hold a permit than the
	 * limit; never two candidates believing they lead, each doing leader-only work (a permit broken
	 * by force is the operator's) */
	if (believers > LIMIT) {
		if (KIND == KIND_ELECTION) uerror("P7 one leader: two candidates believe they lead at once");
		else uerror("P6 at most N: more holders believe they hold a permit than the limit");
	}
	/* P3, per permit: no permit is live for longer than a TTL (plus the server clock's backward steps
	 * meanwhile) while nobody believes it holds it. Each ghost's tracker is kept in the order of the
	 * holders (so that a state does not depend on where a tracker was put) */
	for (i = 0; i < now.ph_len; i++) {
		int live = now.ph_exp[i] > now.srv, held = 0;
		if (!live) continue;
		for (w = 0; w < NW; w++) if (believes_at(w) && now.ltok[w] == now.ph_o[i]) held = 1;
		if (held) { believed_live++; continue; }
		g_tok[ghosts] = now.ph_o[i]; g_fen[ghosts] = now.ph_fen[i]; g_since[ghosts] = now.rt; g_back[ghosts] = 0;
		for (k = 0; k < NH; k++)
			if (now.pg_since[k] != NONE && now.pg_tok[k] == now.ph_o[i] && now.pg_fen[k] == now.ph_fen[i]) {
				g_since[ghosts] = now.pg_since[k]; g_back[ghosts] = now.pg_back[k];
			}
		if (now.rt - g_since[ghosts] > T + g_back[ghosts])
			uerror("P3 ghost: a permit live for longer than a TTL while nobody believes it holds it");
		ghosts++;
	}
	for (k = 0; k < NH; k++) {
		now.pg_tok[k] = k < ghosts ? g_tok[k] : 0; now.pg_fen[k] = k < ghosts ? g_fen[k] : 0;
		now.pg_since[k] = k < ghosts ? g_since[k] : NONE; now.pg_back[k] = k < ghosts ? g_back[k] : 0;
	}
	/* P4: while someone waits and the permits believed leave room, a waiter takes one within a TTL
	 * (judged where no fault that delays by itself is in play) */
	if (believed_live < LIMIT && waits && now.rt >= now.fr_quiet) {
		if (now.fr_since == NONE) now.fr_since = now.rt;
		if (now.rt - now.fr_since > T + M)
			uerror("P4 wake-up: a free (or unbelieved) permit not taken within a TTL while someone waits");
	} else {
		now.fr_since = NONE;
	}
}
void check_properties(void)
{
	int w, p, believes, believers = 0, believed = 0, waits = 0;
	int live = now.d_ex && now.d_own != 0 && now.d_exp > now.srv;
	if (KIND != KIND_LOCK) { check_permits(); return; }
	for (w = 0; w < NW; w++) {
		p = w / NT;
		believes = now.alive[p] && now.ts[w] == TS_HOLD && now.rt < now.ldl[w];
		if (believes && !now.lforced[w]) believers++;
		if (believes && live && now.ltok[w] == now.d_own) believed = 1;
		if (now.alive[p] && now.pz[p] <= now.rt && now.ts[w] == TS_WAIT && (now.tgu[w] == NONE || now.rt < now.tgu[w]))
			waits = 1;
	}
	/* P1: at most one holder believes it holds the lease (a lease broken by force is the operator's) */
	if (believers > 1) uerror("P1 exclusion: two holders believe they hold the lease");
	/* P3: no lease is live for longer than a TTL (plus the server clock's backward steps meanwhile)
	 * while nobody believes it holds it */
	if (live && !believed) {
		if (now.gh_since == NONE || now.gh_tok != now.d_own || now.gh_fen != now.d_fence) {
			now.gh_since = now.rt; now.gh_tok = now.d_own; now.gh_fen = now.d_fence; now.gh_back = 0;
		}
		if (now.rt - now.gh_since > T + now.gh_back)
			uerror("P3 ghost: a lease live for longer than a TTL while nobody believes it holds it");
	} else {
		now.gh_since = NONE; now.gh_tok = 0; now.gh_fen = 0; now.gh_back = 0;
	}
	/* P4: a lock free on the server's clock, or held by a lease nobody believes in, is taken by a
	 * waiter within a TTL while someone waits: no lost wake-up, no oversleep, and no hand-off to a
	 * waiter that is gone (judged where no fault that delays by itself, a pause, a kill, a held
	 * request or a clock step, is in play) */
	if (!believed && waits && now.rt >= now.fr_quiet) {
		if (now.fr_since == NONE) now.fr_since = now.rt;
		/* (a holder stops believing M before the server's expiry: that margin is not a wait) */
		if (now.rt - now.fr_since > T + M)
			uerror("P4 wake-up: a free (or unbelieved) lock not taken within a TTL while someone waits");
	} else {
		now.fr_since = NONE;
	}
}
}

inline check()
{
	c_code { check_properties(); }
}

/* ================================================================================================
 * The world
 * ============================================================================================== */

proctype Req(byte r)
{
	do
	SERVER(r)
	od
}

proctype Process(byte p)
{
	do
	PROCESS(p)
	od
}

proctype Task(byte w)
{
	byte p = w / NT;
	do
	TASK(p, w)
	od
}

/* the environment: the server's clock steps, an operator breaks the lease, idle cleanup; and time */
proctype World()
{
	do
	:: d_step { f_step > 0 -> f_step--; printf("%d/%d CLOCK STEP back\n", rt, srv); srv = srv - DB; gh_back = gh_back + DB; c_code { step_back_trackers(); }; fr_since = NONE; fr_quiet = rt + T + 1; check() }
	:: d_step { f_step > 0 -> f_step--; printf("%d/%d CLOCK STEP forward\n", rt, srv); srv = srv + M; fr_since = NONE; fr_quiet = rt + T + 1; check() }
	:: d_step { f_force > 0 && (PERMITS -> ANY_PLIVE : LIVE) -> f_force--; printf("%d/%d FORCE RELEASE of %d\n", rt, srv, d_own);
		if
		:: PERMITS -> psrv_force()
		:: else -> srv_force()
		fi; check() }
	:: d_step { f_purge > 0 && d_ex && d_exp + PURGE_AFTER <= srv -> f_purge--; printf("%d/%d PURGE\n", rt, srv); srv_purge(); check() }
	/* time moves on when nothing is due */
	:: d_step { rt < H && !URGENT -> rt++; srv++; printf("---- tick: rt %d, server clock %d\n", rt, srv); check() }
	od
}

init {
	c_code {
		H = model_setting("H", 6); ACQS = model_setting("ACQS", 1); START_BY = model_setting("START_BY", 255); FAIR = model_setting("FAIR", 0);
		HB = model_setting("HB", 0); STREAK = model_setting("STREAK", 8); MUT = model_setting("MUT", 0); MUT2 = model_setting("MUT2", 0);
		{ int i; for (i = 0; i < NW; i++) TTO[i] = model_list("TIMEOUTS", i, 1);
		  for (i = 0; i < NP; i++) TASKS[i] = model_list("TASKS", i, NT); }
		now.f_hold = model_setting("F_HOLD", 0); now.f_lost = model_setting("F_LOST", 0);
		now.f_cancel = model_setting("F_CANCEL", 0); now.f_pause = model_setting("F_PAUSE", 0);
		now.f_kill = model_setting("F_KILL", 0); now.f_step = model_setting("F_STEP", 0);
		now.f_event = model_setting("F_EVENT", 0); now.f_stream = model_setting("F_STREAM", 0);
		now.f_force = model_setting("F_FORCE", 0); now.f_purge = model_setting("F_PURGE", 0);
		now.f_slow = model_setting("F_SLOW", 0);
		RESIGN_TO = model_setting("RESIGN_TO", 0);
		KIND = model_setting("KIND", KIND_LOCK); LIMIT = (KIND == KIND_ELECTION ? 1 : model_setting("LIMIT", 1));
		if (KIND == KIND_ELECTION) { FAIR = 1; HB = 1; }   /* an election serves in turn, and always renews */
	};
	d_step {
		w_ = 0;
		do
		:: w_ < NW -> tacq[w_] = (w_ % NT < TASKS[w_ / NT] -> ACQS : 0); ts[w_] = (tacq[w_] > 0 -> TS_IDLE : TS_DONE); treq[w_] = NONE; tgu[w_] = NONE; tat[w_] = NONE; lren[w_] = NONE; rgen[w_] = NONE;
			twd[w_] = NONE; w_++
		:: else -> break
		od;
		w_ = 0;
		do
		:: w_ < NP -> alive[w_] = 1; kp_req[w_] = NONE; lq_look[w_] = NONE; w_++
		:: else -> break
		od
	};
	atomic {
		w_ = 0;
		do
		:: w_ < NR -> run Req(w_); w_++
		:: else -> break
		od;
		w_ = 0;
		do
		:: w_ < NP -> run Process(w_); w_++
		:: else -> break
		od;
		w_ = 0;
		do
		:: w_ < NW -> run Task(w_); w_++
		:: else -> break
		od;
		run World()
	}
}
