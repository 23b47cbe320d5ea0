//! An ordered map kept as a list of sorted chunks of at most [`CHUNK`] entries, for an index that is walked in
//! key order far more than it is changed: a walk reads each chunk's entries one after another in memory (which the
//! processor streams), where a `BTreeMap` follows a pointer every eleven entries or so. An insertion or removal finds
//! its chunk by a binary search over the chunks' first keys, then shifts at most one chunk's entries.
//!
//! Used for `ClusterState::tenant_runs`, which a quota-held victim search walks from a tenant's first running job
//! (`schedule::preempt`): on `bench sched --policy las --backfill` those walks were the largest part of the slowest
//! events, their entries mostly out of the cache (`docs/scheduler.md`).

/// Entries per chunk at most; a full chunk that takes one more is split in two halves.
const CHUNK: usize = 128;

/// The map (see the module docs). Every chunk is non-empty and sorted, and every key of a chunk is below every key
/// of the next; `firsts` holds each chunk's first key.
#[derive(Debug, Clone)]
pub struct ChunkedMap<K, V> {
    chunks: Vec<Vec<(K, V)>>,
    firsts: Vec<K>,
    len: usize,
}

impl<K, V> Default for ChunkedMap<K, V> {
    fn default() -> Self {
        Self { chunks: Vec::new(), firsts: Vec::new(), len: 0 }
    }
}

impl<K: Ord + Copy, V> ChunkedMap<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries in the map.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk that holds `k` if any chunk does: the last whose first key is at most `k` (the first chunk when
    /// `k` is below every key). `None` only when the map is empty.
    fn chunk_of(&self, k: &K) -> Option<usize> {
        if self.chunks.is_empty() {
            return None;
        }
        Some(self.firsts.partition_point(|f| f <= k).saturating_sub(1))
    }

    /// Inserts `v` at `k`; returns the value it replaces.
    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        let Some(c) = self.chunk_of(&k) else {
            self.chunks.push(vec![(k, v)]);
            self.firsts.push(k);
            self.len = 1;
            return None;
        };
        let chunk = &mut self.chunks[c];
        match chunk.binary_search_by(|(x, _)| x.cmp(&k)) {
            Ok(i) => return Some(std::mem::replace(&mut chunk[i].1, v)),
            Err(i) => {
                chunk.insert(i, (k, v));
                if i == 0 {
                    self.firsts[c] = k;
                }
            }
        }
        self.len += 1;
        if chunk.len() > CHUNK {
            let tail = chunk.split_off(chunk.len() / 2);
            self.firsts.insert(c + 1, tail[0].0);
            self.chunks.insert(c + 1, tail);
        }
        None
    }

    /// The value at `k`, to change.
    pub fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        let c = self.chunk_of(k)?;
        let chunk = &mut self.chunks[c];
        let i = chunk.binary_search_by(|(x, _)| x.cmp(k)).ok()?;
        Some(&mut chunk[i].1)
    }

    /// Removes the entry at `k`; returns its value. A chunk left empty goes; one left under a quarter full is
    /// merged into the next when both fit in one chunk.
    pub fn remove(&mut self, k: &K) -> Option<V> {
        let c = self.chunk_of(k)?;
        let chunk = &mut self.chunks[c];
        let i = chunk.binary_search_by(|(x, _)| x.cmp(k)).ok()?;
        let (_, v) = chunk.remove(i);
        self.len -= 1;
        if chunk.is_empty() {
            self.chunks.remove(c);
            self.firsts.remove(c);
            return Some(v);
        }
        if i == 0 {
            self.firsts[c] = chunk[0].0;
        }
        let left = chunk.len();
        if left < CHUNK / 4 && self.chunks.get(c + 1).is_some_and(|n| left + n.len() <= CHUNK) {
            let next = self.chunks.remove(c + 1);
            self.firsts.remove(c + 1);
            self.chunks[c].extend(next);
        }
        Some(v)
    }

    /// The entries from the first whose key is at least `from`, in key order.
    pub fn range_from(&self, from: &K) -> impl Iterator<Item = (&K, &V)> + '_ {
        let (c, i) = match self.chunk_of(from) {
            None => (0, 0),
            Some(c) => (c, self.chunks[c].partition_point(|(x, _)| x < from)),
        };
        let first = self.chunks.get(c).map_or(&[][..], |ch| &ch[i..]);
        first.iter().chain(self.chunks.get(c + 1..).unwrap_or(&[]).iter().flatten()).map(|(k, v)| (k, v))
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.chunks.iter().flatten().map(|(k, v)| (k, v))
    }
}

impl<K: Ord + Copy, V> FromIterator<(K, V)> for ChunkedMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut m = Self::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

impl<K: Ord + Copy, V: PartialEq> PartialEq for ChunkedMap<K, V> {
    /// The same entries, however chunked.
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Every chunk non-empty, at most `CHUNK` long and sorted, the chunks in order, `firsts` and `len` right.
    fn check<K: Ord + Copy + std::fmt::Debug, V>(m: &ChunkedMap<K, V>) {
        assert_eq!(m.chunks.len(), m.firsts.len());
        assert_eq!(m.chunks.iter().map(Vec::len).sum::<usize>(), m.len);
        for (c, ch) in m.chunks.iter().enumerate() {
            assert!(!ch.is_empty() && ch.len() <= CHUNK, "chunk {c}: {} entries", ch.len());
            assert_eq!(ch[0].0, m.firsts[c]);
            assert!(ch.windows(2).all(|w| w[0].0 < w[1].0), "chunk {c} unsorted");
            if c > 0 {
                assert!(m.chunks[c - 1].last().unwrap().0 < ch[0].0, "chunks {} and {c} out of order", c - 1);
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        Remove(u16),
        Change(u16, u32),
        RangeFrom(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Keys from a small space, so that removals and replacements hit; runs long enough to split and merge.
        prop_oneof![
            4 => (0u16..600, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => (0u16..600).prop_map(Op::Remove),
            1 => (0u16..600, any::<u32>()).prop_map(|(k, v)| Op::Change(k, v)),
            1 => (0u16..650).prop_map(Op::RangeFrom),
        ]
    }

    proptest! {
        /// Any sequence of insertions, removals, changes and walks gives what a `BTreeMap` gives, and keeps the
        /// chunks' invariants.
        #[test]
        fn behaves_as_a_btreemap(ops in proptest::collection::vec(op(), 1..3000)) {
            let mut m: ChunkedMap<u16, u32> = ChunkedMap::new();
            let mut b: BTreeMap<u16, u32> = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Insert(k, v) => prop_assert_eq!(m.insert(k, v), b.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(m.remove(&k), b.remove(&k)),
                    Op::Change(k, v) => {
                        let (x, y) = (m.get_mut(&k), b.get_mut(&k));
                        prop_assert_eq!(x.is_some(), y.is_some());
                        if let (Some(x), Some(y)) = (x, y) {
                            *x = v;
                            *y = v;
                        }
                    }
                    Op::RangeFrom(k) => {
                        let got: Vec<(u16, u32)> = m.range_from(&k).map(|(k, v)| (*k, *v)).collect();
                        let want: Vec<(u16, u32)> = b.range(k..).map(|(k, v)| (*k, *v)).collect();
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(m.len(), b.len());
            }
            check(&m);
            prop_assert!(m.iter().map(|(k, v)| (*k, *v)).eq(b.iter().map(|(k, v)| (*k, *v))));
            let rebuilt: ChunkedMap<u16, u32> = b.iter().map(|(k, v)| (*k, *v)).collect();
            prop_assert!(rebuilt == m, "equal whatever the chunking");
        }
    }

    /// Ascending insertions split full chunks in halves; removing all but a few merges them back.
    #[test]
    fn full_chunks_split_and_sparse_ones_merge() {
        let mut m: ChunkedMap<u32, ()> = (0..1000).map(|k| (k, ())).collect();
        check(&m);
        assert!(m.chunks.len() >= 1000 / CHUNK, "{} chunks", m.chunks.len());
        for k in 0..1000 {
            if k % 50 != 0 {
                m.remove(&k);
            }
        }
        check(&m);
        assert_eq!(m.len(), 20);
        assert!(m.chunks.len() <= 2, "20 entries left in {} chunks", m.chunks.len());
        assert_eq!(m.range_from(&951).count(), 0);
        assert_eq!(m.range_from(&901).map(|(k, _)| *k).collect::<Vec<u32>>(), vec![950]);
        assert!(!m.is_empty());
    }
}
