/* lse.h: the full-vocabulary logsumexp of a logits row, the denominator of every logprob the llama
 * engine writes (model.c: model_logsumexp) and of llama-mtmd-ref's (llama/bench/mtmd_ref.c), one code
 * so that the two print the same bits from the same logits. Header-only: both compile it with
 * $(LLAMA_CFLAGS). */
#ifndef SERVEPROTO_LLAMA_LSE_H
#define SERVEPROTO_LLAMA_LSE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x) for x <= 0 in float: Cody-Waite reduction x = n ln2 + r and Cephes
 * expf's degree-6 polynomial for exp(r) (relative error below 1e-7 against
 * libm's exp over [-80, 0]). x is clamped at -80 so 2^n stays a normal float
 * (denormals are slow): terms below e^-80 of the largest one do not move a
 * logsumexp. Branch-free, so the loops below vectorize (-O3 -fno-trapping-math). */
static inline float expf_nonpos(float x)
{
    x = x > -80.0f ? x : -80.0f;
    int32_t n = (int32_t)(x * 1.44269504088896341f - 0.5f); /* round to nearest for x <= 0 */
    float fn = (float)n;
    float r = x - fn * 0.693359375f - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t bits = (n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

#define LSE_LANES 8
#define LSE_BLOCK 256

/* log(sum_i exp(logits[i])) over n >= 1 logits, shifted by the maximum for
 * range; the log-softmax of token t is then logits[t] - lse. The exponentials
 * are float (see expf_nonpos), summed in float within blocks of LSE_BLOCK and
 * in double across blocks: |error| ~1e-8 against a double-precision sum on a
 * 49k vocabulary, about 4x faster than libm's exp. */
static inline double lse_logsumexp(const float *logits, int n)
{
    float mv[LSE_LANES];
    for (int j = 0; j < LSE_LANES; j++)
        mv[j] = logits[0];
    int i = 0;
    for (; i + LSE_LANES <= n; i += LSE_LANES)
        for (int j = 0; j < LSE_LANES; j++)
            mv[j] = logits[i + j] > mv[j] ? logits[i + j] : mv[j];
    float mx = mv[0];
    for (int j = 1; j < LSE_LANES; j++)
        mx = mv[j] > mx ? mv[j] : mx;
    for (; i < n; i++)
        mx = logits[i] > mx ? logits[i] : mx;

    double total = 0.0;
    float tmp[LSE_BLOCK];
    for (int b = 0; b < n; b += LSE_BLOCK) {
        int m = n - b < LSE_BLOCK ? n - b : LSE_BLOCK;
        for (int k = 0; k < m; k++)
            tmp[k] = expf_nonpos(logits[b + k] - mx);
        float acc[LSE_LANES] = { 0 };
        int k = 0;
        for (; k + LSE_LANES <= m; k += LSE_LANES)
            for (int j = 0; j < LSE_LANES; j++)
                acc[j] += tmp[k + j];
        for (; k < m; k++)
            acc[0] += tmp[k];
        for (int j = 0; j < LSE_LANES; j++)
            total += (double)acc[j];
    }
    return (double)mx + log(total);
}

#endif
