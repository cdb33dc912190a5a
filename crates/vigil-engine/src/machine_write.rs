//! How conditions are written on a Machine in each Cluster API form (being written).
