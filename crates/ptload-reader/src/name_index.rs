//! Entries looked up by name in constant time, the one index the
//! checkpoint, the state dict and the set share: a hash table of entries
//! (indices into the owner's list) whose names live in that list, never
//! copied. Each call says how to get an entry's name back from the list.

use std::hash::BuildHasher;

use hashbrown::HashTable;

/// An index of entries `T` (an index into the owner's list, or a pair of
/// them) by their names.
#[derive(Debug, Clone, Default)]
pub(crate) struct NameIndex<T = u32> {
    table: HashTable<T>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl<T: Copy> NameIndex<T> {
    /// Room for `n` entries.
    pub(crate) fn with_capacity(n: usize) -> Self {
        NameIndex {
            table: HashTable::with_capacity(n),
            hasher: Default::default(),
        }
    }

    /// The hash of `name`, for [`find_hashed`](Self::find_hashed) and
    /// [`insert_hashed`](Self::insert_hashed) when one name is looked up
    /// and then inserted.
    pub(crate) fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name)
    }

    /// The entry named `name` (its hash `hash`); `name_of` gives an
    /// entry's name.
    pub(crate) fn find_hashed<'n>(
        &self,
        hash: u64,
        name: &str,
        name_of: impl Fn(T) -> Option<&'n str>,
    ) -> Option<T> {
        self.table
            .find(hash, |&e| name_of(e) == Some(name))
            .copied()
    }

    /// The entry named `name`.
    pub(crate) fn find<'n>(&self, name: &str, name_of: impl Fn(T) -> Option<&'n str>) -> Option<T> {
        self.find_hashed(self.hash(name), name, name_of)
    }

    /// Add `entry`, whose name hashes to `hash` and is not in the index
    /// (the caller looked).
    pub(crate) fn insert_hashed<'n>(
        &mut self,
        hash: u64,
        entry: T,
        name_of: impl Fn(T) -> Option<&'n str>,
    ) {
        let hasher = &self.hasher;
        self.table
            .insert_unique(hash, entry, |&e| hasher.hash_one(name_of(e).unwrap_or("")));
    }

    /// Add `entry` named `name`; the entry already there when the name is
    /// taken.
    pub(crate) fn insert<'n>(
        &mut self,
        name: &str,
        entry: T,
        name_of: impl Fn(T) -> Option<&'n str> + Copy,
    ) -> Result<(), T> {
        let hash = self.hash(name);
        if let Some(first) = self.find_hashed(hash, name, name_of) {
            return Err(first);
        }
        self.insert_hashed(hash, entry, name_of);
        Ok(())
    }

    /// Room for `n` more entries.
    pub(crate) fn reserve<'n>(&mut self, n: usize, name_of: impl Fn(T) -> Option<&'n str>) {
        let hasher = &self.hasher;
        self.table
            .reserve(n, |&e| hasher.hash_one(name_of(e).unwrap_or("")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_by_name_and_refuses_a_second_entry_of_a_name() {
        let names = ["a", "b", "a"];
        let name_of = |i: u32| names.get(i as usize).copied();
        let mut index = NameIndex::with_capacity(0);
        assert_eq!(index.insert("a", 0, name_of), Ok(()));
        assert_eq!(index.insert("b", 1, name_of), Ok(()));
        assert_eq!(index.insert("a", 2, name_of), Err(0));
        assert_eq!(index.find("b", name_of), Some(1));
        assert_eq!(index.find("c", name_of), None);
    }
}
