//! librdkafka's key partitioners, so the relay knows which partition a row
//! goes to before it sends it (and can hold back the rows of a partition
//! whose leader is down).
//!
//! The relay never sets a record's partition itself: librdkafka partitions
//! every record as usual, so a key lands where any other librdkafka producer
//! with the same `partitioner` puts it (`outbox replay`, other services). The
//! prediction only decides what to send now and what to hold back, and a
//! wrong one (a stale partition count) costs latency, never order.

/// A keyed partitioner of librdkafka (`partitioner` setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Partitioner {
    /// `consistent_random` (librdkafka's default) and `consistent`: CRC-32 of the key.
    Crc32 {
        /// `consistent` hashes an empty key too; `consistent_random` sends it
        /// to a random partition.
        empty_key_hashed: bool,
    },
    /// `murmur2_random` and `murmur2`: Kafka's Java client partitioner.
    Murmur2,
    /// `fnv1a_random` and `fnv1a`: the Sarama (Go) partitioner.
    Fnv1a,
}

impl Partitioner {
    /// The partitioner a producer with this `partitioner` setting uses for
    /// keyed records; `None` for one whose choice cannot be known
    /// beforehand (`random`, or a value librdkafka would refuse anyway).
    pub(crate) fn from_setting(setting: Option<&str>) -> Option<Self> {
        match setting.map_or("consistent_random", str::trim) {
            "consistent_random" => Some(Self::Crc32 {
                empty_key_hashed: false,
            }),
            "consistent" => Some(Self::Crc32 {
                empty_key_hashed: true,
            }),
            "murmur2_random" | "murmur2" => Some(Self::Murmur2),
            "fnv1a_random" | "fnv1a" => Some(Self::Fnv1a),
            _ => None,
        }
    }

    /// The partition librdkafka picks for `key` among `count` partitions, or
    /// `None` where it picks at random (an empty key, except with
    /// `consistent`) or there are no partitions.
    pub(crate) fn partition(self, key: &[u8], count: i32) -> Option<i32> {
        if count <= 0 {
            return None;
        }
        let hash = match self {
            Self::Crc32 { empty_key_hashed } => {
                if key.is_empty() && !empty_key_hashed {
                    return None;
                }
                crc32(key)
            }
            _ if key.is_empty() => return None,
            Self::Murmur2 => murmur2(key) & 0x7fff_ffff,
            Self::Fnv1a => fnv1a(key),
        };
        Some((hash % count as u32) as i32)
    }
}

/// CRC-32 (IEEE 802.3, as zlib), what librdkafka's `rd_crc32` computes.
fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut n = 0;
        while n < 256 {
            let mut c = n as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[n] = c;
            n += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &byte in data {
        crc = TABLE[((crc ^ u32::from(byte)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// Kafka's murmur2 (seed `0x9747b28c`), as librdkafka's `rd_murmur2`.
fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// FNV-1a, 32 bits, made non-negative as Sarama does (librdkafka's `rd_fnv1a`).
fn fnv1a(data: &[u8]) -> u32 {
    const PRIME: i32 = 0x0100_0193;
    const OFFSET: u32 = 0x811c_9dc5;
    let mut h = OFFSET as i32;
    for &byte in data {
        h ^= i32::from(byte);
        h = h.wrapping_mul(PRIME);
    }
    h.wrapping_abs() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of librdkafka's own unit tests (`rdmurmur2.c`, `rdfnv1a.c`).
    const KEYS: [&str; 11] = [
        "kafka",
        "giberish123456789",
        "1234",
        "234",
        "34",
        "4",
        "PreAmbleWillBeRemoved,ThePrePartThatIs",
        "reAmbleWillBeRemoved,ThePrePartThatIs",
        "eAmbleWillBeRemoved,ThePrePartThatIs",
        "AmbleWillBeRemoved,ThePrePartThatIs",
        "",
    ];

    #[test]
    fn hashes_match_librdkafkas_test_vectors() {
        let java_murmur2: [u32; 11] = [
            0xd067cf64, 0x8f552b0c, 0x9fc97b14, 0xe7c009ca, 0x873930da, 0x5a4b5ca1, 0x78424f1c,
            0x4a62b377, 0xe0e4e09e, 0x62b8b43f, 0x106e08d9,
        ];
        let go_fnv1a: [u32; 11] = [
            0x0d33c4e1, 0x77a58295, 0x023bdd03, 0x2dea3cd2, 0x740fa83e, 0x310ca263, 0x65cbd69c,
            0x6e49c79a, 0x69eed356, 0x6abcc023, 0x7ee3623b,
        ];
        for (i, key) in KEYS.iter().enumerate() {
            assert_eq!(murmur2(key.as_bytes()), java_murmur2[i], "murmur2 {key:?}");
            assert_eq!(fnv1a(key.as_bytes()), go_fnv1a[i], "fnv1a {key:?}");
        }
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn settings_map_to_partitioners_and_empty_keys_follow_librdkafka() {
        let default = Partitioner::from_setting(None).unwrap();
        assert_eq!(
            Partitioner::from_setting(Some("consistent_random")),
            Some(default)
        );
        assert_eq!(Partitioner::from_setting(Some("random")), None);
        assert_eq!(
            Partitioner::from_setting(Some("murmur2")),
            Some(Partitioner::Murmur2)
        );
        assert_eq!(default.partition(b"", 6), None, "random for an empty key");
        let consistent = Partitioner::from_setting(Some("consistent")).unwrap();
        assert_eq!(consistent.partition(b"", 6), Some(0));
        assert_eq!(default.partition(b"key", 0), None);
        for key in KEYS.iter().filter(|k| !k.is_empty()) {
            let p = default.partition(key.as_bytes(), 7).unwrap();
            assert_eq!(p, (crc32(key.as_bytes()) % 7) as i32);
            let p = Partitioner::Murmur2.partition(key.as_bytes(), 7).unwrap();
            assert!((0..7).contains(&p));
        }
    }
}
