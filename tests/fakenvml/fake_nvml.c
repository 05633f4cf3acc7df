/*
 * A fake libnvidia-ml.so.1 for gpumon's tests.
 *
 * The real nvidia-ml-py bindings load this library exactly as they would load
 * the driver's, so the whole NVML path of gpumon runs without a GPU.
 *
 * Everything it reports comes from a text file named by $FAKE_NVML_CONFIG,
 * re-read whenever it changes (tests move values by rewriting it):
 *
 *   driver 550.54.15
 *   cuda 12040
 *   init_error 18                      # nvmlInit fails with this NVML code
 *   delay nvmlDeviceGetUtilizationRates 300   # ms; "*" delays every call
 *   topo_default 50                    # common-ancestor level for unlisted pairs
 *   gpu name="NVIDIA H100" uuid=GPU-... bus=00000000:17:00.0 mem_total=N
 *       mem_used=N util=40 mem_util=20 temp=30..90 ...   (one line, see gpu_set)
 *       minor=N                        # its /dev/nvidiaN (default: its index)
 *   proc gpu=0 pid=1234 mem=N type=compute sm=40
 *   link 0 1 10                        # nvmlDeviceGetTopologyCommonAncestor level
 *   nvlink 0 1 4                       # four active NVLinks between cards 0 and 1
 *   xid gpu=1 at=2.5 code=79           # XID event 2.5 s after nvmlInit
 *   xid gpu=0 at=1 type=0x2000 code=0  # another NVML event (fatal poison); code= is its data
 *   scan_env 1                         # list real processes pinned by CUDA_VISIBLE_DEVICES
 *   scan_env_mem 1073741824            #   ... each using this many bytes (default 1 GiB)
 *   scan_env_ignore podman,docker      #   ... but never these programs (by comm): a container
 *                                      #   engine's client never opens a card itself
 *   count_error 999                    # nvmlDeviceGetCount fails with this code
 *   driver_unloaded 1                  # the kernel driver is unloaded (see below)
 *   nvswitches 4                       # NVSwitch chips that switch_links= go to
 *   fabric_info_max 2                  # nvmlDeviceGetGpuFabricInfoV knows struct v2 only
 *
 * A value written "lo..hi" moves between lo and hi (triangle wave, 10 s); "v+R/s"
 * (or "lo..hi+R/s") also climbs by R a second since the config file was written (a counter
 * going up, across gpumon processes, as a card's counters do).
 * Faults: per card lost_after=SECONDS (and back_after=SECONDS: the card answers
 * again from then on, as after a reset), handle_error=CODE, unsupported=f1,f2,
 * fail=field:code,..., slow=MS (every call on this card takes MS longer: a card
 * going bad); functions are removed at link time by the test suite.
 *
 * Machines real servers are:
 * - NVSwitch boards (HGX/DGX): switch_links=18 gives the card 18 NVLinks whose
 *   remote end is an NVSwitch (nvmlDeviceGetNvLinkRemoteDeviceType says SWITCH,
 *   the remote PCI info is the switch's); nvmlDeviceGetP2PStatus(a, b, NVLINK)
 *   is OK between cards on switches with the same nvdomain=N (default 0).
 * - Fabric state: fabric=not_started|in_progress|completed (fabric_status=CODE
 *   for a completed but failed registration, fabric_health=N for the v3 health
 *   summary); without fabric= the call answers NOT_SUPPORTED, like PCIe cards.
 * - Driver reloads: while `driver_unloaded 1`, nvmlInit fails with
 *   DRIVER_NOT_LOADED and every call does too; once it is gone again every call
 *   answers UNINITIALIZED until nvmlInit is called again (the old session is
 *   gone), and event sets from before answer UNINITIALIZED for ever.
 * - Live MIG: mig=N (N >= 0: MIG mode on, N slices) may change while the
 *   library runs; handles of destroyed slices answer INVALID_ARGUMENT.
 *   mig_used=B0,B1,... is each slice's used memory.
 *
 * - Health counters (see health_set): each is NOT_SUPPORTED until the card's line
 *   gives it, as on a card or driver without it. remap_cor= remap_unc=
 *   remap_pending= remap_failure= (nvmlDeviceGetRemappedRows; remap_pending_after=S
 *   makes a remap pending S seconds after the file was written), retired_sbe= retired_dbe=
 *   retired_pending= (page retirement), ecc_corrected= ecc_corrected_agg=
 *   ecc_uncorrected_agg=, pcie_replay=, mem_temp= mem_temp_max=, energy_mj=
 *   (the counter then grows by the card's power every call), nvlink_tx_kibs=
 *   nvlink_rx_kibs= (KiB/s per active NVLink), nvlink_crc_flit= nvlink_crc_data=
 *   nvlink_replay= nvlink_recovery=, clk_sw_power= clk_sync_boost= clk_sw_thermal=
 *   clk_hw_thermal= clk_hw_power_brake= (percent of the time since the file was
 *   written that the clocks were held down), recovery_action=N (field 230: the driver's
 *   recovery action, 0 none .. 4 drain and reset), events=0x... (the event types the card
 *   supports; default XID, PState, double-bit ECC), and gpm=1 (a Hopper card: GPM answers gpm_gr= gpm_sm=
 *   gpm_occupancy= gpm_tensor= gpm_dram=; other cards answer NOT_SUPPORTED).
 *
 * scan_env (see its block below): every real process whose /proc/PID/environ has
 * CUDA_VISIBLE_DEVICES naming a card's UUID (one entry of its comma list) is a
 * compute process of that card, so a test sees a launched job on exactly the card
 * it was pinned to, as the real driver would.
 */
#include <ctype.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OK 0
#define E_UNINITIALIZED 1
#define E_INVALID_ARGUMENT 2
#define E_NOT_SUPPORTED 3
#define E_NO_PERMISSION 4
#define E_NOT_FOUND 6
#define E_INSUFFICIENT_SIZE 7
#define E_DRIVER_NOT_LOADED 9
#define E_TIMEOUT 10
#define E_GPU_IS_LOST 15
#define E_LIB_RM_VERSION_MISMATCH 18
#define E_ARGUMENT_VERSION_MISMATCH 25
#define E_UNKNOWN 999

#define MAX_GPUS 64
#define MAX_PROCS 8192
#define MAX_LINKS 256
#define MAX_XIDS 64
#define MAX_DELAYS 32
#define MAX_FAILS 16
#define MAX_NVLINKS 18
#define CPU_WORDS 16 /* 1024 CPUs */

typedef struct {
    double lo, hi;
    double rate; /* per second since nvmlInit: a counter that climbs */
    int set;     /* given in the config: a health counter is NOT_SUPPORTED until it is */
} val_t;

typedef struct {
    char field[24];
    int code;
} fail_t;

struct gpu {
    int present;
    int index;
    char name[96];
    char uuid[96];
    char bus[32];
    unsigned int pci_device_id;
    val_t mem_total, mem_used, mem_reserved, util, mem_util, temp, fan, power_mw,
        power_limit_mw, clock_sm, clock_mem, pstate, throttle, ecc_uncorrected,
        pcie_tx_kbs, pcie_rx_kbs, enc, dec;
    unsigned long long cpus[CPU_WORDS];
    int has_cpus;
    int numa;
    int minor; /* its /dev/nvidiaN; < 0: its index */
    double lost_after; /* < 0: never */
    int handle_error;
    fail_t fails[MAX_FAILS];
    int nfails;
    int nvlink_peer[MAX_NVLINKS];
    int nvlinks;
    int switch_links; /* NVLinks to NVSwitches, after the card-to-card ones */
    int nvdomain;     /* cards on switches of one domain reach each other over NVLink */
    int mig_mode;     /* MIG mode on, with mig_count slices */
    int compute_mode; /* nvmlComputeMode_t: 0 default, 1 exclusive thread, 2 prohibited, 3 exclusive process */
    int mig_count;
    unsigned long long mig_used[7];
    double back_after; /* lost between lost_after and back_after (< 0: for good) */
    int slow_ms;
    int fabric_state; /* 0: no fabric (NOT_SUPPORTED); 1 not started, 2 in progress, 3 completed */
    int fabric_status;
    int fabric_health;
    /* health counters (health_set) */
    val_t remap_cor, remap_unc, remap_pending, remap_failure, retired_sbe, retired_dbe, retired_pending,
        ecc_corrected, ecc_corrected_agg, ecc_uncorrected_agg, pcie_replay, mem_temp, mem_temp_max, energy_mj,
        nvlink_tx_kibs, nvlink_rx_kibs, nvlink_crc_flit, nvlink_crc_data, nvlink_replay, nvlink_recovery,
        clk_sw_power, clk_sync_boost, clk_sw_thermal, clk_hw_thermal, clk_hw_power_brake,
        gpm_gr, gpm_sm, gpm_occupancy, gpm_tensor, gpm_dram, recovery_action;
    double remap_pending_after; /* < 0: never */
    int gpm;
    unsigned long long events; /* event types the card supports (nvmlDeviceGetSupportedEventTypes) */
};

#define MAX_MIGS 7
static struct gpu migs[MAX_GPUS][MAX_MIGS];

struct proc {
    int gpu;
    unsigned int pid;
    val_t mem;
    int graphics;
    val_t sm, mem_util;
    int has_util;
};

struct xid {
    int gpu;
    double at;
    unsigned long long code; /* the event's data: the XID, or the recovery action */
    unsigned long long type; /* nvmlEventType*: 0x8 (XID) unless type= says otherwise */
    int delivered;
};

struct delay {
    char fn[64];
    int ms;
};

static struct {
    char driver[80];
    int cuda;
    int init_error;
    int topo_default;
    int ngpus;
    struct gpu gpus[MAX_GPUS];
    int nprocs;
    struct proc procs[MAX_PROCS];
    int nlinks;
    int links[MAX_LINKS][3];
    int nxids;
    struct xid xids[MAX_XIDS];
    int ndelays;
    struct delay delays[MAX_DELAYS];
    int scan_env;        /* see the scan_env block */
    double scan_env_mem;
    char scan_env_ignore[256]; /* ",name,name," */
    int count_error;
    int driver_unloaded;
    int nvswitches;
    int fabric_info_max; /* newest nvmlGpuFabricInfo version the driver knows (2 or 3) */
} C;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int session; /* bumped by each nvmlInit after the driver came back: old event sets die */
static double init_time;
static double last_check;
static struct timespec loaded_mtime;
static off_t loaded_size = -1;

static double now_mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Seconds since the config file was written: climbing counters count from then, so they keep
 * climbing across gpumon processes (each calls nvmlInit) as a real card's do, until a test
 * writes the file again. */
static double since_config(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = ts.tv_sec + ts.tv_nsec / 1e9 - (loaded_mtime.tv_sec + loaded_mtime.tv_nsec / 1e9);
    return t > 0 ? t : 0;
}

static unsigned long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + ts.tv_nsec / 1000;
}

static double value(val_t v) {
    double climbed = v.rate ? v.rate * since_config() : 0;
    if (v.lo == v.hi) return v.lo + climbed;
    double phase = now_mono() / 10.0;
    phase -= (long long)phase;
    double tri = phase < 0.5 ? phase * 2 : (1 - phase) * 2;
    return v.lo + (v.hi - v.lo) * tri + climbed;
}

static val_t parse_val(const char *s) {
    val_t v;
    memset(&v, 0, sizeof v);
    const char *dots = strstr(s, "..");
    char *end;
    v.lo = strtod(s, &end);
    v.hi = dots ? strtod(dots + 2, &end) : v.lo;
    size_t n = strlen(s);
    if (*end == '+' && n >= 2 && !strcmp(s + n - 2, "/s")) v.rate = strtod(end + 1, NULL); /* "v+R/s" */
    v.set = 1;
    return v;
}

static void parse_cpus(const char *s, unsigned long long *mask) {
    memset(mask, 0, CPU_WORDS * sizeof *mask);
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s) break;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        for (long c = a; c <= b && c < CPU_WORDS * 64; c++) mask[c / 64] |= 1ULL << (c % 64);
        s = *end == ',' ? end + 1 : end;
    }
}

static void add_fail(struct gpu *g, const char *field, int code) {
    if (g->nfails >= MAX_FAILS) return;
    snprintf(g->fails[g->nfails].field, sizeof g->fails[0].field, "%s", field);
    g->fails[g->nfails++].code = code;
}

/* "a,b,c" -> each field fails with code; "a:4,b:999" -> per-field codes */
static void parse_fails(struct gpu *g, const char *s, int default_code) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *colon = strchr(tok, ':');
        int code = default_code;
        if (colon) {
            *colon = 0;
            code = atoi(colon + 1);
        }
        add_fail(g, tok, code);
    }
}

/* Split "key=value" tokens; values may be double-quoted. */
static char *next_token(char **p, char **key, char **val) {
    char *s = *p;
    while (*s && isspace((unsigned char)*s)) s++;
    if (!*s) return NULL;
    *key = s;
    while (*s && *s != '=' && !isspace((unsigned char)*s)) s++;
    if (*s != '=') {
        *val = s;
        if (*s) *s++ = 0;
        *p = s;
        return *key;
    }
    *s++ = 0;
    if (*s == '"') {
        *val = ++s;
        while (*s && *s != '"') s++;
    } else {
        *val = s;
        while (*s && !isspace((unsigned char)*s)) s++;
    }
    if (*s) *s++ = 0;
    *p = s;
    return *key;
}

/* The health counters' keys; 1 when `k` is one of them. */
static int health_set(struct gpu *g, const char *k, const char *v) {
#define NUM(f) if (!strcmp(k, #f)) { g->f = parse_val(v); return 1; }
    NUM(remap_cor) NUM(remap_unc) NUM(remap_pending) NUM(remap_failure) NUM(retired_sbe) NUM(retired_dbe)
    NUM(retired_pending) NUM(ecc_corrected) NUM(ecc_corrected_agg) NUM(ecc_uncorrected_agg) NUM(pcie_replay)
    NUM(mem_temp) NUM(mem_temp_max) NUM(energy_mj) NUM(nvlink_tx_kibs) NUM(nvlink_rx_kibs) NUM(nvlink_crc_flit)
    NUM(nvlink_crc_data) NUM(nvlink_replay) NUM(nvlink_recovery) NUM(clk_sw_power) NUM(clk_sync_boost)
    NUM(clk_sw_thermal) NUM(clk_hw_thermal) NUM(clk_hw_power_brake) NUM(gpm_gr) NUM(gpm_sm) NUM(gpm_occupancy)
    NUM(gpm_tensor) NUM(gpm_dram) NUM(recovery_action)
#undef NUM
    if (!strcmp(k, "remap_pending_after")) {
        g->remap_pending_after = atof(v);
        if (!g->remap_pending.set) g->remap_pending = parse_val("0");
        return 1;
    }
    if (!strcmp(k, "gpm")) {
        g->gpm = atoi(v);
        return 1;
    }
    return 0;
}

static void gpu_set(struct gpu *g, const char *k, const char *v) {
#define NUM(f) if (!strcmp(k, #f)) { g->f = parse_val(v); return; }
    NUM(mem_total) NUM(mem_used) NUM(mem_reserved) NUM(util) NUM(mem_util) NUM(temp)
    NUM(fan) NUM(power_mw) NUM(power_limit_mw) NUM(clock_sm) NUM(clock_mem) NUM(pstate)
    NUM(throttle) NUM(ecc_uncorrected) NUM(pcie_tx_kbs) NUM(pcie_rx_kbs) NUM(enc) NUM(dec)
#undef NUM
    if (!strcmp(k, "name")) snprintf(g->name, sizeof g->name, "%s", v);
    else if (!strcmp(k, "uuid")) snprintf(g->uuid, sizeof g->uuid, "%s", v);
    else if (!strcmp(k, "bus")) snprintf(g->bus, sizeof g->bus, "%s", v);
    else if (!strcmp(k, "pci_device_id")) g->pci_device_id = strtoul(v, NULL, 0);
    else if (!strcmp(k, "cpus")) { parse_cpus(v, g->cpus); g->has_cpus = 1; }
    else if (!strcmp(k, "numa")) g->numa = atoi(v);
    else if (!strcmp(k, "minor")) g->minor = atoi(v);
    else if (!strcmp(k, "lost_after")) g->lost_after = atof(v);
    else if (!strcmp(k, "handle_error")) g->handle_error = atoi(v);
    else if (!strcmp(k, "unsupported")) parse_fails(g, v, E_NOT_SUPPORTED);
    else if (!strcmp(k, "fail")) parse_fails(g, v, E_UNKNOWN);
    else if (!strcmp(k, "compute_mode")) g->compute_mode = atoi(v);
    else if (!strcmp(k, "mig")) {
        g->mig_mode = 1;
        g->mig_count = atoi(v) > MAX_MIGS ? MAX_MIGS : atoi(v);
    } else if (!strcmp(k, "mig_used")) {
        const char *s = v;
        for (int i = 0; i < MAX_MIGS && *s; i++) {
            char *end;
            g->mig_used[i] = strtoull(s, &end, 10);
            s = *end == ',' ? end + 1 : end;
        }
    } else if (!strcmp(k, "back_after")) g->back_after = atof(v);
    else if (!strcmp(k, "slow")) g->slow_ms = atoi(v);
    else if (!strcmp(k, "switch_links")) g->switch_links = atoi(v);
    else if (!strcmp(k, "nvdomain")) g->nvdomain = atoi(v);
    else if (!strcmp(k, "fabric")) {
        g->fabric_state = !strcmp(v, "not_started") ? 1 : !strcmp(v, "in_progress") ? 2
                        : !strcmp(v, "completed") ? 3 : 0;
    } else if (!strcmp(k, "fabric_status")) g->fabric_status = atoi(v);
    else if (!strcmp(k, "fabric_health")) g->fabric_health = atoi(v);
    else if (!strcmp(k, "events")) g->events = strtoull(v, NULL, 0);
    else if (!health_set(g, k, v)) fprintf(stderr, "fake_nvml: unknown gpu key %s\n", k);
}

static void gpu_defaults(struct gpu *g, int index) {
    memset(g, 0, sizeof *g);
    g->present = 1;
    g->index = index;
    snprintf(g->name, sizeof g->name, "Fake GPU %d", index);
    snprintf(g->uuid, sizeof g->uuid, "GPU-00000000-0000-0000-0000-%012d", index);
    snprintf(g->bus, sizeof g->bus, "00000000:%02X:00.0", 0x10 + index);
    g->pci_device_id = 0x233010DE;
    g->mem_total.lo = g->mem_total.hi = 16.0 * (1 << 30);
    g->power_limit_mw.lo = g->power_limit_mw.hi = 300000;
    g->numa = -1;
    g->minor = -1;
    g->lost_after = -1;
    g->back_after = -1;
    g->remap_pending_after = -1;
    g->events = 0x8 | 0x4 | 0x2; /* XID, PState, double-bit ECC: what older cards offer */
}

static void load_config(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    memset(&C, 0, sizeof C);
    memset(migs, 0, sizeof migs); /* slices not named again are destroyed */
    C.nvswitches = 4;
    C.fabric_info_max = 3;
    snprintf(C.driver, sizeof C.driver, "550.54.15");
    C.cuda = 12040;
    C.topo_default = 50;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash && (hash == line || isspace((unsigned char)hash[-1]))) *hash = 0;
        char *p = line, *k, *v;
        char word[32];
        if (sscanf(line, "%31s", word) != 1) continue;
        p = strstr(line, word) + strlen(word);
        if (!strcmp(word, "driver")) sscanf(p, "%79s", C.driver);
        else if (!strcmp(word, "cuda")) C.cuda = atoi(p);
        else if (!strcmp(word, "init_error")) C.init_error = atoi(p);
        else if (!strcmp(word, "topo_default")) C.topo_default = atoi(p);
        else if (!strcmp(word, "scan_env")) C.scan_env = atoi(p);
        else if (!strcmp(word, "scan_env_mem")) C.scan_env_mem = atof(p);
        else if (!strcmp(word, "scan_env_ignore")) {
            char names[250] = "";
            sscanf(p, "%249s", names);
            snprintf(C.scan_env_ignore, sizeof C.scan_env_ignore, ",%s,", names);
        }
        else if (!strcmp(word, "count_error")) C.count_error = atoi(p);
        else if (!strcmp(word, "driver_unloaded")) C.driver_unloaded = atoi(p);
        else if (!strcmp(word, "nvswitches")) C.nvswitches = atoi(p) > 0 ? atoi(p) : 1;
        else if (!strcmp(word, "fabric_info_max")) C.fabric_info_max = atoi(p);
        else if (!strcmp(word, "delay") && C.ndelays < MAX_DELAYS) {
            struct delay *d = &C.delays[C.ndelays];
            if (sscanf(p, "%63s %d", d->fn, &d->ms) == 2) C.ndelays++;
        } else if (!strcmp(word, "gpu") && C.ngpus < MAX_GPUS) {
            struct gpu *g = &C.gpus[C.ngpus];
            gpu_defaults(g, C.ngpus);
            while (next_token(&p, &k, &v)) gpu_set(g, k, v);
            /* MIG slices: equal shares of the card, with MIG UUIDs and no NVML index. */
            for (int i = 0; i < g->mig_count; i++) {
                struct gpu *m = &migs[C.ngpus][i];
                gpu_defaults(m, -1);
                snprintf(m->name, sizeof m->name, "%s MIG %dg", g->name, 7 / g->mig_count);
                snprintf(m->uuid, sizeof m->uuid, "MIG-%.8s-%04d-0000-0000-%012d", g->uuid + 4, i, C.ngpus);
                snprintf(m->bus, sizeof m->bus, "%s", g->bus);
                m->mem_total.lo = m->mem_total.hi = value(g->mem_total) / g->mig_count;
                m->mem_used.lo = m->mem_used.hi = (double)g->mig_used[i];
                m->lost_after = g->lost_after;
                m->back_after = g->back_after;
            }
            C.ngpus++;
        } else if (!strcmp(word, "proc") && C.nprocs < MAX_PROCS) {
            struct proc *pr = &C.procs[C.nprocs++];
            memset(pr, 0, sizeof *pr);
            while (next_token(&p, &k, &v)) {
                if (!strcmp(k, "gpu")) pr->gpu = atoi(v);
                else if (!strcmp(k, "pid")) pr->pid = strtoul(v, NULL, 10);
                else if (!strcmp(k, "mem")) pr->mem = parse_val(v);
                else if (!strcmp(k, "type")) pr->graphics = !strcmp(v, "graphics");
                else if (!strcmp(k, "sm")) { pr->sm = parse_val(v); pr->has_util = 1; }
                else if (!strcmp(k, "mem_util")) pr->mem_util = parse_val(v);
            }
        } else if (!strcmp(word, "link") && C.nlinks < MAX_LINKS) {
            int *l = C.links[C.nlinks];
            if (sscanf(p, "%d %d %d", &l[0], &l[1], &l[2]) == 3) C.nlinks++;
        } else if (!strcmp(word, "nvlink")) {
            int a, b, n;
            if (sscanf(p, "%d %d %d", &a, &b, &n) == 3 && a < MAX_GPUS && b < MAX_GPUS) {
                for (int i = 0; i < n; i++) {
                    struct gpu *ga = &C.gpus[a], *gb = &C.gpus[b];
                    if (ga->nvlinks < MAX_NVLINKS) ga->nvlink_peer[ga->nvlinks++] = b;
                    if (gb->nvlinks < MAX_NVLINKS) gb->nvlink_peer[gb->nvlinks++] = a;
                }
            }
        } else if (!strcmp(word, "xid") && C.nxids < MAX_XIDS) {
            struct xid *x = &C.xids[C.nxids++];
            memset(x, 0, sizeof *x);
            x->type = 0x8;
            while (next_token(&p, &k, &v)) {
                if (!strcmp(k, "gpu")) x->gpu = atoi(v);
                else if (!strcmp(k, "at")) x->at = atof(v);
                else if (!strcmp(k, "code")) x->code = strtoull(v, NULL, 10);
                else if (!strcmp(k, "type")) x->type = strtoull(v, NULL, 0);
            }
        }
    }
    fclose(f);
}

/* Re-read the config when the file changed; checked at most every 50 ms. */
static void maybe_reload(void) {
    double t = now_mono();
    if (t - last_check < 0.05 && loaded_size >= 0) return;
    last_check = t;
    const char *path = getenv("FAKE_NVML_CONFIG");
    struct stat st;
    if (!path || stat(path, &st) != 0) return;
    if (st.st_size == loaded_size && st.st_mtim.tv_sec == loaded_mtime.tv_sec &&
        st.st_mtim.tv_nsec == loaded_mtime.tv_nsec)
        return;
    /* Keep delivered flags so a reload does not replay XID events (the same event: the same
     * card, time and code in the same place of the file). */
    struct xid before[MAX_XIDS];
    int nx = C.nxids;
    memcpy(before, C.xids, sizeof before);
    load_config(path);
    for (int i = 0; i < nx && i < C.nxids; i++)
        if (before[i].gpu == C.xids[i].gpu && before[i].at == C.xids[i].at && before[i].code == C.xids[i].code)
            C.xids[i].delivered = before[i].delivered;
    /* An unloaded driver takes NVML's session with it: nvmlInit must be called again. */
    if (C.driver_unloaded) initialized = 0;
    loaded_size = st.st_size;
    loaded_mtime = st.st_mtim;
}

/* Calls per function name, for tests that check what gpumon asks (fakeNvmlCallCount). */
#define MAX_COUNTED 128
static struct { const char *fn; unsigned long n; } counted[MAX_COUNTED];

static void count_call(const char *fn) {
    for (int i = 0; i < MAX_COUNTED; i++) {
        if (counted[i].fn == fn || !counted[i].fn) {
            counted[i].fn = fn;
            counted[i].n++;
            return;
        }
    }
}

unsigned long fakeNvmlCallCount(const char *fn) {
    unsigned long n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_COUNTED && counted[i].fn; i++)
        if (!strcmp(counted[i].fn, fn)) n += counted[i].n;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Sleeps outside the lock, so one slow card never holds up calls to the others. */
static void apply_delay(const char *fn, struct gpu *dev) {
    int ms = 0;
    pthread_mutex_lock(&lock);
    maybe_reload();
    for (int i = 0; i < C.ndelays; i++)
        if (!strcmp(C.delays[i].fn, fn) || !strcmp(C.delays[i].fn, "*")) ms += C.delays[i].ms;
    if (dev) ms += dev->slow_ms;
    pthread_mutex_unlock(&lock);
    if (ms > 0) usleep((useconds_t)ms * 1000);
}

static int lost_now(struct gpu *g) {
    double t = now_mono() - init_time;
    return g->lost_after >= 0 && t >= g->lost_after && (g->back_after < 0 || t < g->back_after);
}

/* What every call answers before it looks at its card: driver gone, session gone. */
static int library_error(void) {
    if (C.driver_unloaded) return E_DRIVER_NOT_LOADED;
    if (!initialized) return E_UNINITIALIZED;
    return OK;
}

static int gpu_error(struct gpu *g, const char *field) {
    int lib = library_error();
    if (lib) return lib;
    if (!g || !g->present) return E_INVALID_ARGUMENT;
    if (lost_now(g)) return E_GPU_IS_LOST;
    for (int i = 0; i < g->nfails; i++)
        if (!strcmp(g->fails[i].field, field)) return g->fails[i].code;
    return OK;
}

/* Every device entry point: optional delay, lock, reload, fault checks. */
#define ENTER(dev, field)                     \
    apply_delay(__func__, (dev));             \
    pthread_mutex_lock(&lock);                \
    count_call(__func__);                     \
    maybe_reload();                           \
    int rc_ = gpu_error((dev), (field));      \
    if (rc_) {                                \
        pthread_mutex_unlock(&lock);          \
        return rc_;                           \
    }
#define LEAVE(rc)                 \
    do {                          \
        pthread_mutex_unlock(&lock); \
        return (rc);              \
    } while (0)

typedef struct gpu *nvmlDevice_t;
typedef int nvmlReturn_t;

/* ---- library ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    apply_delay(__func__, NULL); /* a sick machine: nvmlInit itself takes seconds */
    pthread_mutex_lock(&lock);
    loaded_size = -1;
    maybe_reload();
    int err = C.driver_unloaded ? E_DRIVER_NOT_LOADED : C.init_error;
    if (!err) {
        if (!initialized) {
            init_time = now_mono(); /* times in the config (lost_after, xid at=) count from here */
            session++;
            for (int i = 0; i < C.nxids; i++) C.xids[i].delivered = 0; /* a new session's timeline */
        }
        initialized = 1;
    }
    pthread_mutex_unlock(&lock);
    return err;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    return OK;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case E_UNINITIALIZED: return "Uninitialized";
    case E_INVALID_ARGUMENT: return "Invalid Argument";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_NO_PERMISSION: return "Insufficient Permissions";
    case E_NOT_FOUND: return "Not Found";
    case E_INSUFFICIENT_SIZE: return "Insufficient Size";
    case E_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case E_TIMEOUT: return "Timeout";
    case 13: return "Function Not Found";
    case E_GPU_IS_LOST: return "GPU is lost";
    case E_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case E_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src) {
    if (strlen(src) + 1 > len) return E_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return OK;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    pthread_mutex_lock(&lock);
    maybe_reload();
    int rc = library_error();
    if (!rc) rc = copy_str(version, length, C.driver);
    pthread_mutex_unlock(&lock);
    return rc;
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return nvmlSystemGetDriverVersion(version, length);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    pthread_mutex_lock(&lock);
    maybe_reload();
    int rc = library_error();
    if (!rc) *v = C.cuda;
    pthread_mutex_unlock(&lock);
    return rc;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    apply_delay(__func__, NULL);
    pthread_mutex_lock(&lock);
    count_call(__func__);
    maybe_reload();
    int rc = library_error();
    if (!rc) rc = C.count_error;
    if (!rc) *count = C.ngpus;
    pthread_mutex_unlock(&lock);
    return rc;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev) {
    apply_delay(__func__, index < MAX_GPUS ? &C.gpus[index] : NULL);
    pthread_mutex_lock(&lock);
    count_call(__func__);
    maybe_reload();
    int rc = library_error();
    if (!rc && index >= (unsigned)C.ngpus) rc = E_INVALID_ARGUMENT;
    if (!rc) rc = C.gpus[index].handle_error;
    if (!rc && lost_now(&C.gpus[index])) rc = E_GPU_IS_LOST;
    if (!rc) *dev = &C.gpus[index];
    pthread_mutex_unlock(&lock);
    return rc;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) {
    return nvmlDeviceGetHandleByIndex_v2(i, d);
}

static nvmlReturn_t handle_where(const char *key, int by_bus, nvmlDevice_t *dev) {
    pthread_mutex_lock(&lock);
    maybe_reload();
    int rc = library_error();
    if (!rc) {
        rc = E_NOT_FOUND;
        for (int i = 0; i < C.ngpus; i++) {
            struct gpu *g = &C.gpus[i];
            if (by_bus ? strcasecmp(g->bus, key) : strcmp(g->uuid, key)) continue;
            rc = g->handle_error ? g->handle_error : lost_now(g) ? E_GPU_IS_LOST : OK;
            if (!rc) *dev = g;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *dev) {
    apply_delay(__func__, NULL);
    return handle_where(uuid, 0, dev);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *dev) {
    apply_delay(__func__, NULL);
    return handle_where(bus, 1, dev);
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus, nvmlDevice_t *dev) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus, dev);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    ENTER(dev, "index");
    *index = dev->index;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minor) {
    ENTER(dev, "minor");
    *minor = dev->minor >= 0 ? dev->minor : dev->index;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    ENTER(dev, "name");
    LEAVE(copy_str(name, length, dev->name));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    ENTER(dev, "uuid");
    LEAVE(copy_str(uuid, length, dev->uuid));
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static void fill_pci(struct gpu *g, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    unsigned int dom = 0, bus = 0, devn = 0, fn = 0;
    sscanf(g->bus, "%x:%x:%x.%x", &dom, &bus, &devn, &fn);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", dom, bus, devn, fn);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->bus);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = devn;
    pci->pciDeviceId = g->pci_device_id;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    ENTER(dev, "pci");
    fill_pci(dev, pci);
    LEAVE(OK);
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(dev, pci);
}
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(dev, pci);
}

/* ---- memory, utilisation, sensors ---- */

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define NVML_MEMORY_V2 0x02000028

/* ---- scan_env: real processes pinned to a card by CUDA_VISIBLE_DEVICES ----
 * With "scan_env 1", /proc is scanned (at most every 200 ms, under the lock) for
 * processes whose environment has CUDA_VISIBLE_DEVICES=<...,UUID,...> naming a card;
 * each is listed as a compute process of that card using scan_env_mem bytes.
 * Processes whose environment cannot be read (other users) are skipped. */
#define MAX_SCANNED 512
#define ENVIRON_MAX (256 * 1024)
static struct { unsigned int pid; int gpu; } scanned[MAX_SCANNED];
static int nscanned;
static double scanned_at = -1;

static void scan_env_add(unsigned int pid, const char *list) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        for (int g = 0; g < C.ngpus && nscanned < MAX_SCANNED; g++)
            if (!strcmp(tok, C.gpus[g].uuid)) {
                scanned[nscanned].pid = pid;
                scanned[nscanned++].gpu = g;
            }
}

static void scan_env_refresh(void) {
    static char env[ENVIRON_MAX];
    if (!C.scan_env) { /* off (again): a list from when it was on lists nobody now */
        nscanned = 0;
        scanned_at = -1;
        return;
    }
    if (scanned_at >= 0 && now_mono() - scanned_at < 0.2) return;
    scanned_at = now_mono();
    nscanned = 0;
    DIR *dir = opendir("/proc");
    if (!dir) return;
    for (struct dirent *e; (e = readdir(dir)) && nscanned < MAX_SCANNED;) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        char path[300];
        if (C.scan_env_ignore[0]) {
            char comm[64] = "", key[70];
            snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
            FILE *c = fopen(path, "r");
            if (c) {
                if (fgets(comm, sizeof comm, c)) comm[strcspn(comm, "\n")] = 0;
                fclose(c);
            }
            snprintf(key, sizeof key, ",%s,", comm);
            if (comm[0] && strstr(C.scan_env_ignore, key)) continue;
        }
        snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(env, 1, sizeof env - 1, f);
        fclose(f);
        env[n] = 0;
        for (char *v = env; v < env + n; v += strlen(v) + 1)
            if (!strncmp(v, "CUDA_VISIBLE_DEVICES=", 21)) scan_env_add(strtoul(e->d_name, NULL, 10), v + 21);
    }
    closedir(dir);
}

static double scan_env_mem_each(void) { return C.scan_env_mem > 0 ? C.scan_env_mem : 1073741824.0; }

static unsigned int scan_env_count(int gpu) {
    unsigned int n = 0;
    scan_env_refresh();
    for (int i = 0; i < nscanned; i++) n += scanned[i].gpu == gpu;
    return n;
}
/* ---- end of scan_env ---- */

static unsigned long long mem_used(struct gpu *g) {
    double used = value(g->mem_used);
    /* Default: the sum of this card's processes, as a real driver would show. */
    if (used == 0)
        for (int i = 0; i < C.nprocs; i++)
            if (C.procs[i].gpu == g->index) used += value(C.procs[i].mem);
    if (value(g->mem_used) == 0 && g->index >= 0) used += scan_env_count(g->index) * scan_env_mem_each();
    return (unsigned long long)used;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m) {
    ENTER(dev, "mem");
    m->total = (unsigned long long)value(dev->mem_total);
    /* v1 counts the driver's reservation as used, like real drivers do. */
    m->used = mem_used(dev) + (unsigned long long)value(dev->mem_reserved);
    m->free = m->used > m->total ? 0 : m->total - m->used;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m) {
    ENTER(dev, "mem");
    if (m->version != NVML_MEMORY_V2) LEAVE(E_ARGUMENT_VERSION_MISMATCH);
    m->total = (unsigned long long)value(dev->mem_total);
    m->reserved = (unsigned long long)value(dev->mem_reserved);
    m->used = mem_used(dev);
    m->free = m->used + m->reserved > m->total ? 0 : m->total - m->used - m->reserved;
    LEAVE(OK);
}

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *u) {
    ENTER(dev, "util");
    u->gpu = (unsigned int)value(dev->util);
    u->memory = (unsigned int)value(dev->mem_util);
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *t) {
    ENTER(dev, "temp");
    if (sensor != 0) LEAVE(E_INVALID_ARGUMENT);
    *t = (unsigned int)value(dev->temp);
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t dev, unsigned int *speed) {
    ENTER(dev, "fan");
    *speed = (unsigned int)value(dev->fan);
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *mw) {
    ENTER(dev, "power");
    *mw = (unsigned int)value(dev->power_mw);
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t dev, unsigned int *mw) {
    ENTER(dev, "power_limit");
    *mw = (unsigned int)value(dev->power_limit_mw);
    LEAVE(OK);
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t dev, unsigned int *mw) {
    return nvmlDeviceGetEnforcedPowerLimit(dev, mw);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    ENTER(dev, "clocks");
    if (type == 1) *mhz = (unsigned int)value(dev->clock_sm);
    else if (type == 2) *mhz = (unsigned int)value(dev->clock_mem);
    else if (type == 0) *mhz = (unsigned int)value(dev->clock_sm);
    else LEAVE(E_NOT_SUPPORTED);
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t dev, int *pstate) {
    ENTER(dev, "pstate");
    *pstate = (int)value(dev->pstate);
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *r) {
    ENTER(dev, "throttle");
    *r = (unsigned long long)value(dev->throttle);
    LEAVE(OK);
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t dev, unsigned long long *r) {
    return nvmlDeviceGetCurrentClocksEventReasons(dev, r);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, int type, int counter,
                                         unsigned long long *count) {
    ENTER(dev, "ecc");
    (void)counter;
    *count = type == 1 ? (unsigned long long)value(dev->ecc_uncorrected) : 0;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t dev, int counter, unsigned int *kbs) {
    ENTER(dev, "pcie");
    *kbs = (unsigned int)value(counter == 0 ? dev->pcie_tx_kbs : dev->pcie_rx_kbs);
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t dev, unsigned int *u, unsigned int *period) {
    ENTER(dev, "enc");
    *u = (unsigned int)value(dev->enc);
    *period = 167000;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t dev, unsigned int *u, unsigned int *period) {
    ENTER(dev, "dec");
    *u = (unsigned int)value(dev->dec);
    *period = 167000;
    LEAVE(OK);
}

/* ---- processes ---- */

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

static nvmlReturn_t list_procs(struct gpu *g, int graphics, unsigned int *count, void *out,
                               size_t stride) {
    unsigned int n = 0, from_env = graphics || g->index < 0 ? 0 : scan_env_count(g->index);
    for (int i = 0; i < C.nprocs; i++)
        if (C.procs[i].gpu == g->index && C.procs[i].graphics == graphics) n++;
    n += from_env;
    if (!out || *count < n) {
        unsigned int had = *count;
        *count = n;
        return (n == 0 && had == 0) ? OK : (n <= had ? OK : E_INSUFFICIENT_SIZE);
    }
    unsigned int j = 0;
    for (int i = 0; i < C.nprocs; i++) {
        struct proc *p = &C.procs[i];
        if (p->gpu != g->index || p->graphics != graphics) continue;
        char *slot = (char *)out + j++ * stride;
        if (stride == sizeof(nvmlProcessInfo_v1_t)) {
            nvmlProcessInfo_v1_t *o = (void *)slot;
            o->pid = p->pid;
            o->usedGpuMemory = (unsigned long long)value(p->mem);
        } else {
            nvmlProcessInfo_v2_t *o = (void *)slot;
            o->pid = p->pid;
            o->usedGpuMemory = (unsigned long long)value(p->mem);
            o->gpuInstanceId = 0xFFFFFFFF;
            o->computeInstanceId = 0xFFFFFFFF;
        }
    }
    for (int i = 0; from_env && i < nscanned; i++) { /* scan_env */
        if (scanned[i].gpu != g->index) continue;
        char *slot = (char *)out + j++ * stride;
        memset(slot, 0, stride);
        ((nvmlProcessInfo_v1_t *)slot)->pid = scanned[i].pid;
        ((nvmlProcessInfo_v1_t *)slot)->usedGpuMemory = (unsigned long long)scan_env_mem_each();
        if (stride != sizeof(nvmlProcessInfo_v1_t))
            ((nvmlProcessInfo_v2_t *)slot)->gpuInstanceId = ((nvmlProcessInfo_v2_t *)slot)->computeInstanceId = 0xFFFFFFFF;
    }
    *count = n;
    return OK;
}

#define PROC_FN(name, graphics, type)                                                 \
    nvmlReturn_t name(nvmlDevice_t dev, unsigned int *count, type *infos) {           \
        ENTER(dev, graphics ? "graphics_procs" : "compute_procs");                    \
        LEAVE(list_procs(dev, graphics, count, infos, sizeof(type)));                 \
    }
PROC_FN(nvmlDeviceGetComputeRunningProcesses_v3, 0, nvmlProcessInfo_v2_t)
PROC_FN(nvmlDeviceGetComputeRunningProcesses_v2, 0, nvmlProcessInfo_v2_t)
PROC_FN(nvmlDeviceGetComputeRunningProcesses, 0, nvmlProcessInfo_v1_t)
PROC_FN(nvmlDeviceGetGraphicsRunningProcesses_v3, 1, nvmlProcessInfo_v2_t)
PROC_FN(nvmlDeviceGetGraphicsRunningProcesses_v2, 1, nvmlProcessInfo_v2_t)
PROC_FN(nvmlDeviceGetGraphicsRunningProcesses, 1, nvmlProcessInfo_v1_t)

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *s,
                                             unsigned int *count, unsigned long long last_seen) {
    ENTER(dev, "proc_util");
    unsigned long long ts = now_us();
    unsigned int n = 0;
    for (int i = 0; i < C.nprocs; i++)
        if (C.procs[i].gpu == dev->index && C.procs[i].has_util) n++;
    /* Like the driver: nothing newer than last_seen means no samples. */
    if (n == 0 || ts <= last_seen) LEAVE(E_NOT_FOUND);
    if (!s || *count < n) {
        *count = n;
        LEAVE(E_INSUFFICIENT_SIZE);
    }
    unsigned int j = 0;
    for (int i = 0; i < C.nprocs; i++) {
        struct proc *p = &C.procs[i];
        if (p->gpu != dev->index || !p->has_util) continue;
        s[j].pid = p->pid;
        s[j].timeStamp = ts;
        s[j].smUtil = (unsigned int)value(p->sm);
        s[j].memUtil = (unsigned int)value(p->mem_util);
        s[j].encUtil = s[j].decUtil = 0;
        j++;
    }
    *count = n;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t dev, unsigned int *mode) {
    ENTER(dev, "compute_mode");
    *mode = (unsigned int)dev->compute_mode;
    LEAVE(OK);
}

/* ---- MIG ---- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending) {
    ENTER(dev, "mig");
    if (dev->index < 0) LEAVE(E_NOT_SUPPORTED); /* a MIG slice itself */
    *current = *pending = dev->mig_mode;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *count) {
    ENTER(dev, "mig");
    *count = dev->mig_mode ? MAX_MIGS : 0;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int index, nvmlDevice_t *mig) {
    ENTER(dev, "mig");
    if (dev->index < 0 || index >= (unsigned)dev->mig_count) LEAVE(E_NOT_FOUND);
    *mig = &migs[dev->index][index];
    LEAVE(OK);
}

/* ---- topology ---- */

nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t dev, unsigned int words, unsigned long *set) {
    ENTER(dev, "cpu_affinity");
    if (!dev->has_cpus) LEAVE(E_NOT_SUPPORTED);
    for (unsigned int i = 0; i < words; i++) set[i] = i < CPU_WORDS ? dev->cpus[i] : 0;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t dev, unsigned int words, unsigned long *set,
                                         int scope) {
    ENTER(dev, "numa");
    (void)scope;
    if (dev->numa < 0) LEAVE(E_NOT_SUPPORTED);
    for (unsigned int i = 0; i < words; i++) set[i] = 0;
    if ((unsigned)dev->numa / 64 < words) set[dev->numa / 64] = 1UL << (dev->numa % 64);
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level) {
    ENTER(a, "topo");
    if (gpu_error(b, "topo")) LEAVE(gpu_error(b, "topo"));
    if (a == b) {
        *level = 0;
        LEAVE(OK);
    }
    *level = C.topo_default;
    for (int i = 0; i < C.nlinks; i++) {
        int *l = C.links[i];
        if ((l[0] == a->index && l[1] == b->index) || (l[0] == b->index && l[1] == a->index))
            *level = l[2];
    }
    LEAVE(OK);
}

#define MAX_LINK_INDEX 18 /* links per card (H100); the bindings allow NVML_NVLINK_MAX_LINKS */
#define NVLINK_DEVICE_TYPE_GPU 0
#define NVLINK_DEVICE_TYPE_SWITCH 2

static int all_links(struct gpu *g) { return g->nvlinks + g->switch_links; }

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, unsigned int *active) {
    ENTER(dev, "nvlink");
    if (all_links(dev) == 0) LEAVE(E_NOT_SUPPORTED);
    if (link >= MAX_LINK_INDEX) LEAVE(E_INVALID_ARGUMENT);
    *active = link < (unsigned)all_links(dev);
    LEAVE(OK);
}

/* Link i < nvlinks goes to another card; the next switch_links go to NVSwitches, in turn. */
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t dev, unsigned int link,
                                                 nvmlPciInfo_t *pci) {
    ENTER(dev, "nvlink");
    if (all_links(dev) == 0) LEAVE(E_NOT_SUPPORTED);
    if (link >= (unsigned)all_links(dev)) LEAVE(E_INVALID_ARGUMENT);
    if (link < (unsigned)dev->nvlinks) {
        fill_pci(&C.gpus[dev->nvlink_peer[link]], pci);
        LEAVE(OK);
    }
    struct gpu sw;
    memset(&sw, 0, sizeof sw);
    snprintf(sw.bus, sizeof sw.bus, "00000000:%02X:00.0", 0xC0 + (int)(link % C.nvswitches) + 0x10 * dev->nvdomain);
    sw.pci_device_id = 0x22A310DE; /* NVSwitch */
    fill_pci(&sw, pci);
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t dev, unsigned int link, unsigned int *type) {
    ENTER(dev, "nvlink");
    if (all_links(dev) == 0) LEAVE(E_NOT_SUPPORTED);
    if (link >= (unsigned)all_links(dev)) LEAVE(E_INVALID_ARGUMENT);
    *type = link < (unsigned)dev->nvlinks ? NVLINK_DEVICE_TYPE_GPU : NVLINK_DEVICE_TYPE_SWITCH;
    LEAVE(OK);
}

#define P2P_CAPS_INDEX_NVLINK 2
#define P2P_STATUS_OK 0
#define P2P_STATUS_NOT_SUPPORTED 5

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, unsigned int *status) {
    ENTER(a, "p2p");
    if (gpu_error(b, "p2p")) LEAVE(gpu_error(b, "p2p"));
    *status = P2P_STATUS_OK;
    if (index == P2P_CAPS_INDEX_NVLINK) {
        int direct = 0;
        for (int i = 0; i < a->nvlinks; i++) direct |= a->nvlink_peer[i] == b->index;
        int switched = a->switch_links && b->switch_links && a->nvdomain == b->nvdomain;
        if (!direct && !switched) *status = P2P_STATUS_NOT_SUPPORTED;
    }
    LEAVE(OK);
}

/* ---- fabric (NVSwitch systems: registration with the fabric manager) ---- */

typedef struct {
    unsigned char clusterUuid[16];
    int status;
    unsigned int cliqueId;
    unsigned int state;
} nvmlGpuFabricInfo_t;
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    int status;
    unsigned int cliqueId;
    unsigned int state;
    unsigned int healthMask;
    unsigned char healthSummary; /* v3 only */
} nvmlGpuFabricInfoV_t;
#define FABRIC_INFO_V2 0x02000024
#define FABRIC_INFO_V3 0x03000028

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t dev, nvmlGpuFabricInfo_t *info) {
    ENTER(dev, "fabric");
    if (!dev->fabric_state) LEAVE(E_NOT_SUPPORTED);
    memset(info, 0, sizeof *info);
    info->state = dev->fabric_state;
    info->status = dev->fabric_status;
    info->cliqueId = 1 + dev->nvdomain;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t dev, nvmlGpuFabricInfoV_t *info) {
    ENTER(dev, "fabric");
    if (info->version != FABRIC_INFO_V2 && (info->version != FABRIC_INFO_V3 || C.fabric_info_max < 3))
        LEAVE(E_ARGUMENT_VERSION_MISMATCH);
    if (!dev->fabric_state) LEAVE(E_NOT_SUPPORTED);
    info->state = dev->fabric_state;
    info->status = dev->fabric_status;
    info->cliqueId = 1 + dev->nvdomain;
    info->healthMask = 0;
    if (info->version == FABRIC_INFO_V3) info->healthSummary = (unsigned char)dev->fabric_health;
    LEAVE(OK);
}

/* ---- events (XID) ---- */

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

struct eventset {
    unsigned long long registered[MAX_GPUS];
    int session;
};
typedef struct eventset *nvmlEventSet_t;

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    pthread_mutex_lock(&lock);
    maybe_reload();
    int rc = library_error();
    if (!rc) {
        *set = calloc(1, sizeof(struct eventset));
        rc = *set ? OK : E_UNKNOWN;
        if (*set) (*set)->session = session;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    free(set);
    return OK;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev, unsigned long long *types) {
    ENTER(dev, "events");
    *types = dev->events;
    LEAVE(OK);
}

/* As the real driver: one type the card lacks refuses the whole registration. */
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types, nvmlEventSet_t set) {
    ENTER(dev, "events");
    if (types & ~dev->events) LEAVE(E_NOT_SUPPORTED);
    set->registered[dev->index] |= types;
    LEAVE(OK);
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    double deadline = now_mono() + timeout_ms / 1000.0;
    for (;;) {
        pthread_mutex_lock(&lock);
        maybe_reload();
        int rc = library_error();
        if (!rc && set->session != session) rc = E_UNINITIALIZED;
        if (rc) {
            pthread_mutex_unlock(&lock);
            return rc;
        }
        double elapsed = now_mono() - init_time;
        double next_due = 0.5; /* a new configuration is noticed within this */
        for (int i = 0; i < C.nxids; i++) {
            struct xid *x = &C.xids[i];
            if (x->delivered || x->gpu >= C.ngpus || !(set->registered[x->gpu] & x->type)) continue;
            if (x->at > elapsed) {
                if (x->at - elapsed < next_due) next_due = x->at - elapsed;
                continue;
            }
            x->delivered = 1;
            memset(data, 0, sizeof *data);
            data->device = &C.gpus[x->gpu];
            data->eventType = x->type;
            data->eventData = x->code;
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
            pthread_mutex_unlock(&lock);
            return OK;
        }
        pthread_mutex_unlock(&lock);
        double left = deadline - now_mono();
        if (left <= 0) return E_TIMEOUT;
        /* The real driver blocks in the kernel until an event or the timeout, costing nothing;
           this wakes up only when an XID comes due, or to notice a new configuration. */
        usleep((useconds_t)(1e6 * (left < next_due ? left : next_due)));
    }
}
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

/* ---- health counters: each NOT_SUPPORTED until the card's config line gives it ---- */

#define NEED(v) if (!(v).set) LEAVE(E_NOT_SUPPORTED)

static unsigned int remap_pending_now(struct gpu *g) {
    if (g->remap_pending_after >= 0 && since_config() >= g->remap_pending_after) return 1;
    return value(g->remap_pending) >= 1;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    ENTER(dev, "remap");
    NEED(dev->remap_cor);
    *corr = (unsigned int)value(dev->remap_cor);
    *unc = (unsigned int)value(dev->remap_unc);
    *pending = remap_pending_now(dev);
    *failure = value(dev->remap_failure) >= 1;
    LEAVE(OK);
}

/* Retired pages: the first call asks the count (INSUFFICIENT_SIZE when there are some), the second
 * fills the addresses (and, _v2, the times). */
static nvmlReturn_t retired_pages(struct gpu *g, int cause, unsigned int *count, unsigned long long *addresses,
                                  unsigned long long *times) {
    val_t *v = cause == 0 ? &g->retired_sbe : &g->retired_dbe;
    if (!v->set) return E_NOT_SUPPORTED;
    unsigned int n = (unsigned int)value(*v);
    if (!addresses || *count < n) {
        *count = n;
        return n ? E_INSUFFICIENT_SIZE : OK;
    }
    for (unsigned int i = 0; i < n; i++) {
        addresses[i] = 0x100000ULL * (i + 1) + (unsigned long long)cause;
        if (times) times[i] = (unsigned long long)time(NULL) - 3600 * (i + 1);
    }
    *count = n;
    return OK;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t dev, int cause, unsigned int *count, unsigned long long *a) {
    ENTER(dev, "retired");
    LEAVE(retired_pages(dev, cause, count, a, NULL));
}

nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t dev, int cause, unsigned int *count, unsigned long long *a,
                                          unsigned long long *t) {
    ENTER(dev, "retired");
    LEAVE(retired_pages(dev, cause, count, a, t));
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, unsigned int *pending) {
    ENTER(dev, "retired");
    NEED(dev->retired_pending);
    *pending = value(dev->retired_pending) >= 1;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t dev, unsigned int *count) {
    ENTER(dev, "pcie_replay");
    NEED(dev->pcie_replay);
    *count = (unsigned int)value(dev->pcie_replay);
    LEAVE(OK);
}

/* Energy counts up with the card's power: each call adds power x time since the last one. Kept
 * outside the config, so rewriting the file never winds the counter back. */
static double energy_acc[MAX_GPUS], energy_at[MAX_GPUS];

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t dev, unsigned long long *mj) {
    ENTER(dev, "energy");
    NEED(dev->energy_mj);
    int i = dev->index >= 0 && dev->index < MAX_GPUS ? dev->index : 0;
    double t = now_mono();
    if (energy_at[i] == 0) energy_acc[i] = value(dev->energy_mj);
    else energy_acc[i] += value(dev->power_mw) * (t - energy_at[i]); /* mW x s = mJ */
    energy_at[i] = t;
    *mj = (unsigned long long)energy_acc[i];
    LEAVE(OK);
}

#define TEMPERATURE_THRESHOLD_MEM_MAX 2

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t dev, int threshold, unsigned int *temp) {
    ENTER(dev, "temp_threshold");
    if (threshold != TEMPERATURE_THRESHOLD_MEM_MAX) LEAVE(E_NOT_SUPPORTED);
    NEED(dev->mem_temp_max);
    *temp = (unsigned int)value(dev->mem_temp_max);
    LEAVE(OK);
}

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    int nvmlReturn;
    union {
        double dVal;
        unsigned int uiVal;
        unsigned long ulVal;
        unsigned long long ullVal;
        long long sllVal;
        int siVal;
        unsigned short usVal;
    } value;
} nvmlFieldValue_t;

#define VALUE_TYPE_UNSIGNED_INT 1
#define VALUE_TYPE_UNSIGNED_LONG_LONG 3

/* The value of one field, NOT_SUPPORTED when the card's line does not give it. */
static int field_value(struct gpu *g, nvmlFieldValue_t *f) {
    double t = since_config();
    val_t *v = NULL;
    double scale = 1;
    f->valueType = VALUE_TYPE_UNSIGNED_LONG_LONG;
    switch (f->fieldId) {
    case 82: v = &g->mem_temp; f->valueType = VALUE_TYPE_UNSIGNED_INT; break; /* NVML_FI_DEV_MEMORY_TEMP */
    case 3: v = &g->ecc_corrected; break;                                     /* ECC_SBE_VOL_TOTAL */
    case 5: v = &g->ecc_corrected_agg; break;                                 /* ECC_SBE_AGG_TOTAL */
    case 6: v = &g->ecc_uncorrected_agg; break;                               /* ECC_DBE_AGG_TOTAL */
    case 38: v = &g->nvlink_crc_flit; break;                                  /* NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL */
    case 45: v = &g->nvlink_crc_data; break;
    case 52: v = &g->nvlink_replay; break;
    case 59: v = &g->nvlink_recovery; break;
    /* Clock-event times (ns): the configured percent of the time since the config was written. */
    case 74: v = &g->clk_sw_power; scale = t * 1e7; break;
    case 76: v = &g->clk_sync_boost; scale = t * 1e7; break;
    case 269: v = &g->clk_sw_thermal; scale = t * 1e7; break;
    case 270: v = &g->clk_hw_thermal; scale = t * 1e7; break;
    case 271: v = &g->clk_hw_power_brake; scale = t * 1e7; break;
    /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: what the driver asks to be done (0 none, 1 GPU reset, ...) */
    case 230: v = &g->recovery_action; f->valueType = VALUE_TYPE_UNSIGNED_INT; break;
    /* NVLink data (KiB) on link scopeId: the configured KiB/s since the config was written. */
    case 138: case 139:
        if (f->scopeId >= (unsigned)all_links(g)) return E_INVALID_ARGUMENT;
        v = f->fieldId == 138 ? &g->nvlink_tx_kibs : &g->nvlink_rx_kibs;
        scale = t;
        break;
    default: return E_NOT_SUPPORTED;
    }
    if (!v->set) return E_NOT_SUPPORTED;
    double x = value(*v) * scale;
    if (f->valueType == VALUE_TYPE_UNSIGNED_INT) f->value.uiVal = (unsigned int)x;
    else f->value.ullVal = (unsigned long long)x;
    return OK;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t *values) {
    ENTER(dev, "fields");
    if (count < 0 || (count && !values)) LEAVE(E_INVALID_ARGUMENT);
    for (int i = 0; i < count; i++) {
        values[i].timestamp = (long long)now_us();
        values[i].latencyUsec = 0;
        values[i].nvmlReturn = field_value(dev, &values[i]);
    }
    LEAVE(OK);
}

/* ---- GPM (Hopper): metrics between two samples ---- */

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

struct gpm_sample {
    struct gpu *dev;
    double at;
};
typedef struct gpm_sample *nvmlGpmSample_t;

typedef struct {
    unsigned int metricId;
    int nvmlReturn;
    double value;
    struct {
        char *shortName, *longName, *unit;
    } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[1]; /* numMetrics of them: the caller's array is NVML_GPM_METRIC_MAX long */
} nvmlGpmMetricsGet_t;

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t dev, nvmlGpmSupport_t *support) {
    ENTER(dev, "gpm");
    if (support->version != 1) LEAVE(E_ARGUMENT_VERSION_MISMATCH);
    if (!dev->gpm) LEAVE(E_NOT_SUPPORTED); /* before Hopper */
    support->isSupportedDevice = 1;
    LEAVE(OK);
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    *sample = calloc(1, sizeof(struct gpm_sample));
    return *sample ? OK : E_UNKNOWN;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    free(sample);
    return OK;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t dev, nvmlGpmSample_t sample) {
    ENTER(dev, "gpm");
    if (!dev->gpm) LEAVE(E_NOT_SUPPORTED);
    if (!sample) LEAVE(E_INVALID_ARGUMENT);
    sample->dev = dev;
    sample->at = now_mono();
    LEAVE(OK);
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    pthread_mutex_lock(&lock);
    count_call(__func__);
    maybe_reload();
    int rc = library_error();
    if (!rc && m->version != 1) rc = E_ARGUMENT_VERSION_MISMATCH;
    if (!rc && (!m->sample1 || !m->sample2 || !m->sample1->dev || m->sample1->dev != m->sample2->dev ||
                m->sample2->at <= m->sample1->at))
        rc = E_INVALID_ARGUMENT;
    if (!rc) rc = gpu_error(m->sample1->dev, "gpm");
    for (unsigned int i = 0; !rc && i < m->numMetrics; i++) {
        nvmlGpmMetric_t *x = &m->metrics[i];
        struct gpu *g = m->sample1->dev;
        val_t *v = x->metricId == 1 ? &g->gpm_gr : x->metricId == 2 ? &g->gpm_sm : x->metricId == 3 ? &g->gpm_occupancy
                 : x->metricId == 5 ? &g->gpm_tensor : x->metricId == 10 ? &g->gpm_dram : NULL;
        x->nvmlReturn = v && v->set ? OK : E_NOT_SUPPORTED;
        x->value = v && v->set ? value(*v) : 0;
        x->metricInfo.shortName = x->metricInfo.longName = x->metricInfo.unit = NULL;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
