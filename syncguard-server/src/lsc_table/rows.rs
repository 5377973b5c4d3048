//! The rows LSC's statements answer with, read by column name: lease duration, expiry and
//! fence are all BIGINT, so a row read by position would still decode after a SELECT's
//! columns were reordered, with two of them swapped. Read by name, a reordered SELECT is read
//! right, and a column renamed or missing fails the read.

use sqlx::postgres::PgRow;
use sqlx::{Decode, Postgres, Row, Type};
use syncguard::LockError;

/// The value of `column` in `row`.
pub(super) fn read<'r, T>(row: &'r PgRow, column: &str) -> Result<T, LockError>
where
    T: Decode<'r, Postgres> + Type<Postgres>,
{
    row.try_get(column).map_err(|error| {
        LockError::internal(format!(
            "unexpected column {column} in a result on the LSC table"
        ))
        .with_source(error)
    })
}

/// What the acquire statement answers for a lock taken.
pub(super) struct Taken {
    /// LSC's expiry, in Unix seconds.
    pub(super) expiry: i64,
    pub(super) fence: Option<i64>,
}

impl Taken {
    pub(super) fn read(row: &PgRow) -> Result<Self, LockError> {
        Ok(Self {
            expiry: read(row, "expiry")?,
            fence: read(row, "fence")?,
        })
    }
}

/// A live lock, as both lookups answer it (the lookup by key without the key's two parts).
pub(super) struct Found {
    pub(super) owner: String,
    pub(super) instance_id: String,
    /// In seconds.
    pub(super) lease_duration: i64,
    /// LSC's expiry, in Unix seconds.
    pub(super) expiry: i64,
    pub(super) fence: Option<i64>,
}

impl Found {
    pub(super) fn read(row: &PgRow) -> Result<Self, LockError> {
        Ok(Self {
            owner: read(row, "owner")?,
            instance_id: read(row, "instance_id")?,
            lease_duration: read(row, "lease_duration")?,
            expiry: read(row, "expiry")?,
            fence: read(row, "fence")?,
        })
    }
}

#[cfg(test)]
mod tests {
    //! On the test PostgreSQL (`SYNCGUARD_TEST_POSTGRES_URL`, as `bash
    //! scripts/with-services.sh` exports it): rows whose BIGINT columns come in another order
    //! than the statements' are read the same.

    use sqlx::PgPool;
    use sqlx::postgres::PgRow;

    use super::{Found, Taken};

    async fn row(sql: &'static str) -> PgRow {
        let url = std::env::var("SYNCGUARD_TEST_POSTGRES_URL").unwrap_or_else(|_| {
            panic!(
                "SYNCGUARD_TEST_POSTGRES_URL is not set: run `bash scripts/test-all.sh`, which \
                 installs PostgreSQL (apt-get install postgresql) and starts it, or \
                 `bash scripts/with-services.sh cargo test ...`"
            )
        });
        let pool = PgPool::connect(&url).await.expect("test PostgreSQL");
        sqlx::query(sql).fetch_one(&pool).await.expect("row")
    }

    #[tokio::test]
    async fn reordered_columns_are_read_by_name() {
        let found = Found::read(
            &row("SELECT 7::BIGINT AS fence, 1700000000::BIGINT AS expiry, \
                  30::BIGINT AS lease_duration, 'i'::TEXT AS instance_id, 'o'::TEXT AS owner")
            .await,
        )
        .expect("read");
        assert_eq!(
            (found.expiry, found.lease_duration, found.fence),
            (1_700_000_000, 30, Some(7))
        );
        assert_eq!(
            (found.owner.as_str(), found.instance_id.as_str()),
            ("o", "i")
        );

        let taken = Taken::read(
            &row("SELECT 7::BIGINT AS fence, 30::BIGINT AS lease_duration, \
                  1700000000::BIGINT AS expiry")
            .await,
        )
        .expect("read");
        assert_eq!((taken.expiry, taken.fence), (1_700_000_000, Some(7)));
    }

    #[tokio::test]
    async fn a_missing_column_fails_the_read() {
        let error = Taken::read(&row("SELECT 7::BIGINT AS fence").await)
            .err()
            .expect("no expiry column");
        assert_eq!(error.code(), syncguard::ErrorCode::Internal);
        assert!(error.to_string().contains("expiry"), "{error}");
    }
}
