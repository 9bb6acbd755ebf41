/*
 * A job's periods (P5), for SPIN: a job's document and the writes the store sends to it
 * (mongolock_async/store/jobs.py as issue 36 changes it: start_pipeline, finish_pipeline, and the
 * lease's renewal), and the replicas that send them, each with its own schedule (every, offset,
 * max_attempts), on a server clock that can step back.
 * A TTL is MODEL_TTL ticks (2 by default, shorter than the periods explored, so a run killed or
 * failed early is retried within its period).
 *
 * docs/model.md says what is modelled and what is not; model/actions.md maps the store's writes
 * to the ACTION comments here (tests/unit/test_model.py checks both).
 *
 * Time: rt counts ticks of real time; srv is the server's clock (S0 + rt, moved back by a step).
 * Nothing is urgent: a replica calls the job, and a run ends, renews or is killed, at any tick, so
 * every timing of the calls and runs within the horizon is explored.
 *
 * A period of a schedule (every e, offset o) is [start, start + e) with
 * start = now - ((now - o) mod e), on the server's clock: store/jobs.py's _period_start. The
 * record keeps tries (the latest starts by the server's clock, in its order, as many as the largest
 * max_attempts allowed: NK here, store/jobs.py's MAX_ATTEMPTS_LIMIT) and lastSuccess (the latest
 * start of a run that succeeded).
 */

#define NP 3            /* replicas */
#define NR 8            /* runs (starts that took the lease) a search can record */
#define NK 3            /* tries kept: the largest max_attempts allowed (MAXA <= NK) */
#define NONE (-1)

c_decl {
	int model_setting(const char *name, int otherwise) {
		char key[64];
		const char *value;
		snprintf(key, sizeof key, "MODEL_%s", name);
		value = getenv(key);
		return value ? atoi(value) : otherwise;
	}
	/* MODEL_<NAME>=a,b,c: the index-th of a list (the last one repeats) */
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

/* ---- the controls --------------------------------------------------------------------------- */
#define MUT_SLOT_NUMBER 1       /* done and attempts by a bare slot number, floor((now - offset) / every) (before issue 36) */
#define MUT_FINISH_UNOWNED 2    /* a finish records its run's success without checking the run still holds the live lease */
#define MUT_TRIES_BY_REQUEST 3  /* tries in the requests' order, the last max_attempts of the caller's kept (issue 36's first rule) */
#define MUTATED(m) (MUT == (m))

/* ---- what one run explores (MODEL_* settings, read by init) ------------------------------- */
hidden byte H;          /* ticks of real time explored */
hidden byte NPR;        /* replicas */
hidden byte EVERY[NP];  /* each replica's schedule */
hidden byte OFFSET[NP];
hidden byte MAXA[NP];
hidden byte MUT;
hidden byte DB;         /* a clock step back: this many ticks */
hidden byte HB;         /* the heartbeat renews a run's lease */
hidden byte T;          /* a TTL, in ticks */

/* ---- the server ----------------------------------------------------------------------------- */
short srv;              /* the server's clock */
byte rt;                /* real time */
byte d_own;             /* owner: a run's number, 0: none */
short d_exp;            /* expiresAt */
byte j_run;             /* job.run: its run's number, 0: null */
short j_succ = NONE;    /* job.lastSuccess: a start, or NONE */
short j_try[NK];        /* job.tries, earliest first (the requests' order with MUT_TRIES_BY_REQUEST) */
byte j_ntry;
short j_dslot = NONE;   /* (MUT_SLOT_NUMBER) job.doneSlot */
short j_slot = NONE;    /* (MUT_SLOT_NUMBER) job.slot */
byte j_att;             /* (MUT_SLOT_NUMBER) job.attempts */

/* ---- the runs (what a run's document says, and what the properties judge by) ---------------- */
byte nrun;              /* runs taken so far */
short r_at[NR];         /* its start (job.run.startedAt) on the server's clock */
short r_a[NR];          /* its period [r_a, r_b), by its replica's schedule */
short r_b[NR];
short r_slot[NR];       /* (MUT_SLOT_NUMBER) its slot number */
bit r_ok[NR];           /* its success is recorded */

/* ---- the replicas --------------------------------------------------------------------------- */
byte calls[NP];         /* calls of the job left */
byte p_run[NP];         /* the run in progress (its number), 0: none */
byte f_kill;            /* kills left: a run's process dies (its lease expires unfinished) */
byte f_step;            /* clock steps back left */
byte f_lost;            /* finishes applied whose reply is lost and that are sent again */

/* a step's temporaries (hidden: not part of the state) */
hidden short x_start; hidden short x_slot; hidden byte x_att; hidden byte x_done; hidden byte x_live; hidden byte i_; hidden byte k_; hidden byte p_;

/* ACTION start_job: LockStore.start_job (jobs.start_pipeline), an upserting findAndModify.
 * WRITES kind owner expiresAt fence ttlMs holder acquiredAt renewedAt job
 * One atomic step on the server: the period of the caller's schedule, then take the lease only if
 * nobody holds it, no run that started at or after the period's start succeeded, and fewer than
 * max_attempts runs started at or after it; a run whose lease expired unfinished is recorded lost. */
inline start_job(p)
{
	x_live = (d_own != 0 && d_exp > srv);
	x_start = srv - (srv - OFFSET[p]) % EVERY[p];
	x_slot = (srv - OFFSET[p]) / EVERY[p];
	if
	:: MUTATED(MUT_SLOT_NUMBER) ->
		x_done = (j_dslot == x_slot);
		x_att = (j_slot == x_slot -> j_att : 0)
	:: else ->
		x_done = (j_succ != NONE && j_succ >= x_start);
		x_att = 0; k_ = 0;
		do
		:: k_ < j_ntry -> x_att = x_att + (j_try[k_] >= x_start -> 1 : 0); k_++
		:: else -> break
		od
	fi;
	if
	:: !x_live && !x_done && x_att < MAXA[p] && nrun < NR ->
		/* taken: a new owner token, a new run */
		r_at[nrun] = srv; r_a[nrun] = x_start; r_b[nrun] = x_start + EVERY[p]; r_slot[nrun] = x_slot;
		check_attempts(x_start, x_start + EVERY[p], MAXA[p]);
		nrun++;
		d_own = nrun; d_exp = srv + T; j_run = nrun; p_run[p] = nrun;
		if
		:: MUTATED(MUT_TRIES_BY_REQUEST) ->
			/* tries: the last max_attempts (the caller's) starts in the requests' order */
			if
			:: j_ntry < NK -> j_try[j_ntry] = srv; j_ntry++
			:: else -> j_try[0] = j_try[1]; j_try[1] = j_try[2]; j_try[2] = srv
			fi;
			do
			:: j_ntry > MAXA[p] -> j_try[0] = j_try[1]; j_try[1] = j_try[2]; j_try[2] = 0; j_ntry--
			:: else -> break
			od
		:: else ->
			/* tries: this start inserted after every earlier one ($filter < now, now, $filter >= now),
			 * the earliest dropped past NK ($slice of the last NK) */
			if
			:: j_ntry < NK ->
				k_ = j_ntry;
				do
				:: k_ > 0 && j_try[k_ - 1] >= srv -> j_try[k_] = j_try[k_ - 1]; k_--
				:: else -> break
				od;
				j_try[k_] = srv; j_ntry++
			:: else ->
				/* full: the earliest of the NK + 1 goes (this one, if none is earlier) */
				k_ = 0;
				do
				:: j_try[0] < srv && k_ + 1 < NK && j_try[k_ + 1] < srv -> j_try[k_] = j_try[k_ + 1]; k_++
				:: else -> break
				od;
				if
				:: j_try[0] < srv -> j_try[k_] = srv
				:: else
				fi
			fi
		fi;
		j_slot = x_slot; j_att = x_att + 1;
		printf("%d/%d p%d TAKES run %d of [%d,%d) (every %d offset %d), attempt %d\n", rt, srv, p, nrun, x_start, x_start + EVERY[p], EVERY[p], OFFSET[p], x_att + 1)
	:: else ->
		/* not taken: a run whose lease expired unfinished leaves job.run as lost */
		if
		:: !x_live && j_run != 0 -> j_run = 0
		:: else
		fi;
		printf("%d/%d p%d skips [%d,%d): live %d done %d attempts %d\n", rt, srv, p, x_start, x_start + EVERY[p], x_live, x_done, x_att)
	fi
}

/* ACTION finish_job: LockStore.finish_job (jobs.finish_pipeline), a findAndModify of the name.
 * WRITES owner expiresAt releasedAt releasedOwner job
 * While the run holds its live lease: record how it ended (a success moves lastSuccess to the run's
 * start) and end the lease. A run whose lease is gone is recorded only as lost, while job.run is it. */
inline finish_job(r, succeeded)
{
	if
	:: j_run == r && d_own == r && d_exp > srv || MUTATED(MUT_FINISH_UNOWNED) ->
		d_own = 0; d_exp = srv; j_run = 0;
		if
		:: succeeded ->
			check_success(r - 1);
			r_ok[r - 1] = 1;
			j_succ = (j_succ > r_at[r - 1] -> j_succ : r_at[r - 1]);
			j_dslot = r_slot[r - 1];
			printf("%d/%d run %d SUCCEEDED (started %d, period [%d,%d))\n", rt, srv, r, r_at[r - 1], r_a[r - 1], r_b[r - 1])
		:: else -> printf("%d/%d run %d failed\n", rt, srv, r)
		fi
	:: j_run == r && !succeeded -> j_run = 0; printf("%d/%d run %d recorded lost\n", rt, srv, r)
	:: else -> printf("%d/%d run %d's finish records nothing\n", rt, srv, r)
	fi
}

/* The heartbeat: lease.pml's action renew (LockStore.renew, mutex._renewal), a new expiry for a
 * live lease, else nothing. */
inline renew(r)
{
	if
	:: d_own == r && d_exp > srv -> d_exp = srv + T
	:: else
	fi
}

/* ---- the properties ------------------------------------------------------------------------- */
c_code {
extern void (*uerror)(char *);
/* P5: a run's success is recorded only if no earlier recorded success started in its period (the
 * period of the schedule in force when it ran, a span of the server's clock). */
void check_success(int r)
{
	int s;
	for (s = 0; s < now.nrun; s++)
		if (s != r && now.r_ok[s] && now.r_at[s] >= now.r_a[r] && now.r_at[s] < now.r_b[r])
			uerror("P5 once per period: a second successful run in one period");
}
/* P5, attempts: a run is taken only while fewer than the caller's max_attempts runs started in its
 * period (MODEL_ATTEMPTS=1 judges it). */
void check_attempts(int a, int b, int most)
{
	int s, n = 0;
	if (!model_setting("ATTEMPTS", 1)) return;
	for (s = 0; s < now.nrun; s++)
		if (now.r_at[s] >= a && now.r_at[s] < b) n++;
	if (n >= most) uerror("P5 attempts: a period's runs past its max_attempts");
}
}
inline check_success(r) { c_code { check_success(i_); } }
inline check_attempts(a, b, m) { c_code { check_attempts(x_start, x_start + EVERY[p_], MAXA[p_]); } }

/* a replica's steps: it calls the job (when no run of its own is in progress), and its run ends
 * (succeeded, failed), renews (the heartbeat), has its finish's reply lost (sent again), or is
 * killed (its lease then expires unfinished) */
#define REPLICA(p) \
	:: d_step { p < NPR && p_run[p] == 0 && calls[p] > 0 -> calls[p]--; p_ = p; start_job(p) } \
	:: d_step { p_run[p] != 0 -> i_ = p_run[p] - 1; finish_job(p_run[p], 1); p_run[p] = 0 } \
	:: d_step { p_run[p] != 0 -> i_ = p_run[p] - 1; finish_job(p_run[p], 0); p_run[p] = 0 } \
	:: d_step { p_run[p] != 0 && f_lost > 0 -> f_lost--; i_ = p_run[p] - 1; finish_job(p_run[p], 1); finish_job(p_run[p], 1); p_run[p] = 0 } \
	:: d_step { p_run[p] != 0 && d_own == p_run[p] && d_exp > srv && HB -> renew(p_run[p]) } \
	:: d_step { p_run[p] != 0 && f_kill > 0 -> f_kill--; printf("%d/%d p%d KILLED in run %d\n", rt, srv, p, p_run[p]); p_run[p] = 0 }

proctype world()
{
	do
	:: d_step { rt < H -> rt++; srv++ }
	:: d_step { f_step > 0 -> f_step--; srv = srv - DB; printf("%d/%d CLOCK STEP back %d\n", rt, srv, DB) }
	REPLICA(0)
	REPLICA(1)
	REPLICA(2)
	od
}

init {
	c_code {
		int i;
		H = model_setting("H", 6); NPR = model_setting("NPR", 2); MUT = model_setting("MUT", 0);
		DB = model_setting("DB", 2); HB = model_setting("HB", 1); T = model_setting("TTL", 2); now.srv = model_setting("S0", 12);
		now.f_kill = model_setting("F_KILL", 0); now.f_step = model_setting("F_STEP", 0); now.f_lost = model_setting("F_LOST", 0);
		for (i = 0; i < NP; i++) {
			EVERY[i] = model_list("EVERY", i, 2); OFFSET[i] = model_list("OFFSET", i, 0);
			MAXA[i] = model_list("MAXA", i, 2); now.calls[i] = model_list("CALLS", i, 3);
		}
	};
	run world()
}
