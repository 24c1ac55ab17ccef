/* kvidx-bench entry point: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/demo.h"
#include "bench/soak.h"

struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
};

static const struct subcommand subcommands[] = {
    {"micro", kvi_bench_micro, "engine store/remove/find costs at 1 M blocks (issue: engine core)"},
    {"ring", kvi_bench_ring, "SPSC ring throughput by burst size"},
    {"decode", kvi_bench_decode, "KV-event batch decoding per core: cursor decoder vs msgpack-c"},
    {"trace", kvi_bench_trace, "Mooncake-trace replay: kvidx vs baselines, keep-up and find latency"},
    {"ingest", kvi_bench_ingest, "ZMQ publishers -> listeners -> writers -> index on the Mooncake event mix"},
    {"demo", kvi_bench_demo, "mock engines publishing a Mooncake trace into a running kvidxd (until Ctrl-C)"},
    {"snapshot", kvi_bench_snapshot, "--nats-snapshot on a 1 M-block JetStream namespace: size, write and load vs replay"},
    {"soak", kvi_bench_soak, "N-minute end-to-end run through kvidxd, then checks errors, RSS, /dump and counters"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvidx-bench SUBCOMMAND [options]   (SUBCOMMAND --help for its options)\n\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "  %-8s %s\n", subcommands[i].name, subcommands[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (!strcmp(argv[1], subcommands[i].name))
            return subcommands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvidx-bench: unknown subcommand '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
