from validation.moe_comm.run import main

raise SystemExit(main())
