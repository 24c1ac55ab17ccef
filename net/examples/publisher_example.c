/*
 * publisher_example: publish KV-cache events the way a vLLM engine does.
 *
 * Build against an installed kvidx publisher:
 *     cc publisher_example.c $(pkg-config --cflags --libs kvidx-publisher)
 * Run (defaults: the vLLM ports):
 *     ./a.out [endpoint [replay_endpoint]]
 * The defaults are vLLM's: PUB bound on port 5557, replay ROUTER on 5558.
 */
#include <kvidx/publisher.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    struct kvidx_pub_config cfg;
    kvidx_pub_config_init(&cfg); /* map form, u64 hashes, medium "GPU", rank 0 */
    cfg.endpoint = argc > 1 ? argv[1] : "tcp://*:5557";
    cfg.replay_endpoint = argc > 2 ? argv[2] : "tcp://*:5558";
    cfg.topic = "kv@engine-0@my-model";

    struct kvidx_pub *pub = kvidx_pub_create(&cfg);
    if (!pub) {
        fprintf(stderr, "kvidx_pub_create: %s\n", strerror(errno));
        return 1;
    }
    printf("publishing on %s, replay on %s\n", kvidx_pub_endpoint(pub),
           kvidx_pub_replay_endpoint(pub));

    /* A 32-token prompt filled two 16-token blocks: one BlockStored event. */
    uint32_t tokens[32];
    for (uint32_t i = 0; i < 32; i++)
        tokens[i] = 1000 + i;
    uint64_t hashes[2] = {0x44424a8f51260936u, 0xda7a5cbe4f4b0c4cu};
    uint64_t id, seq;
    int rc = kvidx_pub_publish_stored(pub, hashes, 2, NULL /* no parent */, tokens, 32, 16, &id);
    if (rc == 0)
        rc = kvidx_pub_flush(pub, &seq); /* one batch: [ts, [event], 0] */
    if (rc == 0)
        printf("event %" PRIu64 " stored 2 blocks in batch %" PRIu64 "\n", id, seq);

    /* Later the second block is evicted. */
    if (rc == 0)
        rc = kvidx_pub_publish_removed(pub, &hashes[1], 1, &id);
    if (rc == 0)
        rc = kvidx_pub_flush(pub, &seq);
    if (rc == 0)
        printf("event %" PRIu64 " removed 1 block in batch %" PRIu64 "\n", id, seq);

    if (rc)
        fprintf(stderr, "publish: %s\n", strerror(-rc));
    kvidx_pub_destroy(pub);
    return rc ? 1 : 0;
}
