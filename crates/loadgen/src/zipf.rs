//! Title popularity: a Zipf distribution over a finite, ranked catalogue.
//!
//! The title at rank `k` (0 = most popular, the first one listed) is chosen with
//! probability proportional to `1 / (k + 1)^s`. Exponent `s = 0` is uniform; video
//! catalogues are usually described with `s` between 0.6 and 1.2. The sampler keeps
//! the cumulative distribution in a table and inverts it with a binary search, so a
//! draw costs one random number and `log2(n)` comparisons, and is exact for any `s`.

/// A sampler of ranks `0..n` with Zipf popularity.
#[derive(Clone, Debug)]
pub(crate) struct Zipf {
    /// `cdf[k]` = P(rank <= k); the last entry is exactly 1.
    cdf: Vec<f64>,
}

impl Zipf {
    /// A sampler over `n >= 1` ranks with exponent `s >= 0` (finite).
    pub(crate) fn new(n: usize, s: f64) -> Zipf {
        assert!(n >= 1, "a Zipf sampler needs at least one rank");
        assert!(s.is_finite() && s >= 0.0, "Zipf exponent must be finite and >= 0");
        let mut cdf = Vec::with_capacity(n);
        let mut sum = 0.0;
        for k in 0..n {
            sum += ((k + 1) as f64).powf(-s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        *cdf.last_mut().expect("n >= 1") = 1.0;
        Zipf { cdf }
    }

    /// The probability of rank `k`.
    #[cfg(test)]
    pub(crate) fn probability(&self, k: usize) -> f64 {
        self.cdf[k] - if k == 0 { 0.0 } else { self.cdf[k - 1] }
    }

    /// A rank drawn with `rng`.
    pub(crate) fn sample(&self, rng: &mut fastrand::Rng) -> usize {
        let u = rng.f64(); // [0, 1)
        self.cdf.partition_point(|&c| c <= u).min(self.cdf.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(z: &Zipf, n: usize, draws: usize, seed: u64) -> Vec<f64> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut counts = vec![0usize; n];
        for _ in 0..draws {
            counts[z.sample(&mut rng)] += 1;
        }
        counts.into_iter().map(|c| c as f64 / draws as f64).collect()
    }

    #[test]
    fn probabilities_follow_the_power_law() {
        let z = Zipf::new(10, 1.0);
        let harmonic: f64 = (1..=10).map(|k| 1.0 / k as f64).sum();
        for k in 0..10 {
            let expected = 1.0 / ((k + 1) as f64 * harmonic);
            assert!((z.probability(k) - expected).abs() < 1e-12, "rank {k}");
        }
        // Rank 0 of 10 with s = 1 is about 34%.
        assert!((z.probability(0) - 0.3414).abs() < 1e-3);
    }

    #[test]
    fn samples_match_the_distribution_for_a_fixed_seed() {
        for &(n, s) in &[(10, 1.0), (100, 0.8), (5, 0.0), (1000, 1.2)] {
            let z = Zipf::new(n, s);
            let draws = 400_000;
            let freq = histogram(&z, n, draws, 42);
            for (k, &f) in freq.iter().enumerate().take(20) {
                let p = z.probability(k);
                // Five standard deviations of a binomial proportion, plus a floor.
                let tolerance = 5.0 * (p * (1.0 - p) / draws as f64).sqrt() + 1e-4;
                assert!((f - p).abs() < tolerance, "n={n} s={s} rank {k}: {f} vs {p}");
            }
            // Popularity never increases with rank (allowing sampling noise).
            if s > 0.0 {
                assert!(freq[0] > freq[n - 1]);
            }
        }
    }

    #[test]
    fn uniform_and_single_rank_edge_cases() {
        let z = Zipf::new(4, 0.0);
        for k in 0..4 {
            assert!((z.probability(k) - 0.25).abs() < 1e-12);
        }
        let one = Zipf::new(1, 1.0);
        let mut rng = fastrand::Rng::with_seed(1);
        assert!((0..1000).all(|_| one.sample(&mut rng) == 0));
    }

    #[test]
    fn same_seed_same_sequence() {
        let z = Zipf::new(50, 0.9);
        let a: Vec<usize> = {
            let mut r = fastrand::Rng::with_seed(7);
            (0..100).map(|_| z.sample(&mut r)).collect()
        };
        let b: Vec<usize> = {
            let mut r = fastrand::Rng::with_seed(7);
            (0..100).map(|_| z.sample(&mut r)).collect()
        };
        assert_eq!(a, b);
    }
}
